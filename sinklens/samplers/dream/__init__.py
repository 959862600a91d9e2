"""Dream sampler, step for step Dream's `diffusion_generate` (generation_utils.py, `_sample`).

`config.py`: the settings (`DreamConfig`, torch-free); `sample.py`: `sample()` (torch).
"""
from sinklens.samplers.dream.config import DreamConfig  # noqa: F401 (the config, importable from here)
