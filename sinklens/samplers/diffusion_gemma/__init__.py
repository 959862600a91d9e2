"""DiffusionGemma's block-diffusion sampler (transformers' DiffusionGemmaGenerationMixin.generate).

`config.py`: the settings (`DiffusionGemmaSamplerConfig`, torch-free); `sample.py`: `sample()` (torch).
"""
from sinklens.samplers.diffusion_gemma.config import DiffusionGemmaSamplerConfig  # noqa: F401 (importable here)
