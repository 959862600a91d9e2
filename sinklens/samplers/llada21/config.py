"""LLaDA2.1 sampler settings (torch-free: the command line reads them for its flags)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from sinklens.params import param_like
from sinklens.samplers.configs import SamplerConfig, param, register
from sinklens.samplers.llada2.config import LLaDA2Config


@register("llada21")
@dataclass
class LLaDA21Config(SamplerConfig):
    """LLaDA2.1's `generate()` (the official model file): LLaDA2.0's block decoding plus token-to-token
    editing; defaults as the official signature. `editing_threshold=None` turns editing off (the
    official code raises a TypeError on None)."""

    length_field: ClassVar[str] = "gen_length"
    # the model card's quality mode (Q mode)
    Q_MODE: ClassVar[dict] = dict(threshold=0.7, editing_threshold=0.5, max_post_steps=16)

    gen_length: int = param_like(LLaDA2Config, "gen_length")
    block_length: int = param_like(LLaDA2Config, "block_length")
    steps: int = param_like(LLaDA2Config, "steps", help="accepted and capped like LLaDA2.0's, but unused "
                                                        "(as in the official code: blocks run until done)")
    threshold: float = param_like(LLaDA2Config, "threshold")
    editing_threshold: float | None = param(0.9, float, "an unmasked generated token is rewritten when the model's "
                                                        "new token differs and its confidence exceeds this "
                                                        "(None = no editing)", min=0)
    max_post_steps: int = param(16, int, "a block stops after this many steps past its last mask", min=0)
    num_to_transfer: int = param(1, int, "masked positions committed per step when none exceeds threshold", min=0)
    minimal_topk: int = param_like(LLaDA2Config, "minimal_topk")
    temperature: float = param_like(LLaDA2Config, "temperature")
    top_p: float | None = param_like(LLaDA2Config, "top_p")
    top_k: int | None = param_like(LLaDA2Config, "top_k")
    eos_early_stop: bool = param(False, bool, "stop after a block once no mask is left and an end token was made")
    eos_id: int | None = param_like(LLaDA2Config, "eos_id")
    mask_id: int | None = param_like(LLaDA2Config, "mask_id")
