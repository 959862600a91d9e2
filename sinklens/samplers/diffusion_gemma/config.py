"""DiffusionGemma sampler settings (torch-free: the command line reads them for its flags)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from sinklens.samplers.registry import SamplerConfig, param, register


@register("diffusion_gemma")
@dataclass
class DiffusionGemmaSamplerConfig(SamplerConfig):
    """DiffusionGemma's `generate()` (transformers' generation_diffusion_gemma.py): canvases of random
    tokens, entropy-bound acceptance, linear temperature schedule, stable-and-confident stopping.
    None = the checkpoint's generation_config.json value, else transformers' default (`DEFAULTS`)."""

    DEFAULTS: ClassVar[dict] = dict(max_new_tokens=256, max_denoising_steps=48, entropy_bound=0.1, t_min=0.4,
                                    t_max=0.8, stability_threshold=1, confidence_threshold=0.005)

    max_new_tokens: int | None = param(None, int, "tokens to generate (rounded up to whole canvases)", min=1)
    max_denoising_steps: int | None = param(None, int, "denoising steps per canvas (at most)", min=1)
    entropy_bound: float | None = param(None, float, "accept the lowest-entropy tokens while their summed "
                                        "entropy minus the largest stays within this bound", gt=0)
    t_min: float | None = param(None, float, "temperature at the last denoising step", min=0)
    t_max: float | None = param(None, float, "temperature at the first denoising step", min=0)
    stability_threshold: int | None = param(None, int, "stop a canvas once its argmax held this many steps", min=0)
    confidence_threshold: float | None = param(None, float, "... and its mean entropy is below this", gt=0)
    eos_token_id: int | list[int] | None = param(None, "ids", "stop token id(s) (default: the checkpoint's)")
    pad_token_id: int | None = param(None, int, "fills a finished row (default: the checkpoint's)", min=0)

    def check(self) -> None:
        if self.t_min is not None and self.t_max is not None and not self.t_max > self.t_min:
            raise ValueError(f"t_max must be > t_min, got t_min={self.t_min}, t_max={self.t_max}")

    @property
    def length(self) -> int:
        return self.max_new_tokens or self.DEFAULTS["max_new_tokens"]
