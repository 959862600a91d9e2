"""LLaDA2.0 sampler, step for step the `generate()` of the official LLaDA2.0 model file.

`config.py`: the settings (`LLaDA2Config`, torch-free); `sample.py`: `sample()` (torch).
"""
from sinklens.samplers.llada2.config import LLaDA2Config  # noqa: F401 (the config, importable from here)
