"""LLaDA2.1 sampler (threshold decoding with token-to-token editing), step for step the `generate()`
of the official LLaDA2.1 model file.

`config.py`: the settings (`LLaDA21Config`, torch-free); `sample.py`: `sample()` (torch).
"""
from sinklens.samplers.llada21.config import LLaDA21Config  # noqa: F401 (the config, importable from here)
