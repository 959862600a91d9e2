"""LLaDA / MMaDA sampler, step for step the `generate()` of LLaDA's repository (generate.py).

`config.py`: the settings (`LLaDAConfig`, torch-free); `sample.py`: `sample()` (torch).
"""
from sinklens.samplers.llada.config import LLaDAConfig  # noqa: F401 (the config, importable from here)
