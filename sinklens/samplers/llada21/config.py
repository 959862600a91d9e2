"""LLaDA2.1 sampler settings (torch-free: the command line reads them for its flags)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from sinklens.samplers.registry import SamplerConfig, param, register


@register("llada21")
@dataclass
class LLaDA21Config(SamplerConfig):
    """LLaDA2.1's `generate()` (the official model file): LLaDA2.0's block decoding plus token-to-token
    editing; defaults as the official signature. `editing_threshold=None` turns editing off (the
    official code raises a TypeError on None)."""

    length_field: ClassVar[str] = "gen_length"
    # the model card's quality mode (Q mode)
    Q_MODE: ClassVar[dict] = dict(threshold=0.7, editing_threshold=0.5, max_post_steps=16)

    # The fields LLaDA2.0 also has are written out here (a sampler's config imports no other sampler's):
    # same names, defaults and ranges as samplers/llada2/config.py.
    gen_length: int = param(2048, int, "at most this many tokens after the prompt", min=1)
    block_length: int = param(32, int, "block size of the block-causal mask (blocks counted from position 0)", min=1)
    steps: int = param(32, int, "accepted and capped like LLaDA2.0's, but unused (as in the official code: "
                                "blocks run until done)", min=1)
    threshold: float = param(0.95, float, "a masked position whose confidence exceeds this commits (any value, as "
                                          "the official code: <= 0 commits every masked position)")
    editing_threshold: float | None = param(0.9, float, "an unmasked generated token is rewritten when the model's "
                                                        "new token differs and its confidence exceeds this "
                                                        "(None = no editing; any value, as the official code)")
    max_post_steps: int = param(16, int, "a block stops after this many steps past its last mask", min=0)
    num_to_transfer: int = param(1, int, "masked positions committed per step when fewer exceed threshold", min=0)
    minimal_topk: int = param(1, int, "caps steps at gen_length // minimal_topk", min=1)
    temperature: float = param(0.0, float, "sampling temperature (0 = greedy)", min=0)
    top_p: float | None = param(None, float, "nucleus sampling mass (None = off; 0 keeps only the most likely "
                                             "token, as the official code)", min=0, max=1)
    top_k: int | None = param(None, int, "top-k sampling (None or 0 = off; at most the vocabulary size)", min=0)
    eos_early_stop: bool = param(False, bool, "stop after a block once no mask is left and an end token was made")
    eos_id: int | None = param(None, int, "end token id (default: the model's)", min=0)
    mask_id: int | None = param(None, int, "mask token id (default: the model's)", min=0)
