"""Encoders (BERT, ModernBERT): one forward pass, recorded as a trace with one step.

`config.py`: the settings (`EncoderConfig`, torch-free); `sample.py`: `sample()` (torch).
"""
from sinklens.samplers.encoder.config import EncoderConfig  # noqa: F401 (the config, importable from here)
