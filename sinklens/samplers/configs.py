"""Old import path of the sampler registry (now `sinklens.samplers.registry`), kept for code
that imports it from here."""
from sinklens.samplers.registry import (  # noqa: F401
    CACHES, SAMPLERS, SamplerConfig, cache_param, expected, get_config, get_sample, param, register)
