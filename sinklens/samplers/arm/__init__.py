"""Autoregressive sampler (Llama, Qwen2, SmolLM2, ...): greedy or sampled decoding with a KV cache.

`config.py`: the settings (`ARMConfig`, torch-free); `sample.py`: `sample()` (torch).
"""
from sinklens.samplers.arm.config import ARMConfig  # noqa: F401 (the config, importable from here)
