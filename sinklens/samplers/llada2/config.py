"""LLaDA2.0 sampler settings (torch-free: the command line reads them for its flags)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from sinklens.samplers.registry import SamplerConfig, param, register


@register("llada2")
@dataclass
class LLaDA2Config(SamplerConfig):
    """LLaDA2.0's `generate()` (the official model file); defaults as the official signature."""

    length_field: ClassVar[str] = "gen_length"

    gen_length: int = param(2048, int, "at most this many tokens after the prompt", min=1)
    block_length: int = param(32, int, "block size of the block-causal mask (blocks counted from position 0)", min=1)
    steps: int = param(32, int, "at most this many denoising steps per block (capped at gen_length // minimal_topk; "
                                "the official code also takes 0 and returns the masks: refused here)", min=1)
    threshold: float = param(0.95, float, "a masked position whose confidence exceeds this commits (any value, as "
                                          "the official code: <= 0 commits every masked position)")
    minimal_topk: int = param(1, int, "caps steps at gen_length // minimal_topk", min=1)
    temperature: float = param(0.0, float, "sampling temperature (0 = greedy)", min=0)
    top_p: float | None = param(None, float, "nucleus sampling mass (None = off; 0 keeps only the most likely "
                                             "token, as the official code)", min=0, max=1)
    top_k: int | None = param(None, int, "top-k sampling (None or 0 = off; at most the vocabulary size)", min=0)
    eos_early_stop: bool = param(False, bool, "return as soon as an end token is committed with no mask before it")
    eos_id: int | None = param(None, int, "end token id (default: the model's)", min=0)
    mask_id: int | None = param(None, int, "mask token id (default: the model's)", min=0)
