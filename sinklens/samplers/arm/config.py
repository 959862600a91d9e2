"""Autoregressive sampler settings (torch-free: the command line reads them for its flags)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from sinklens.samplers.registry import SamplerConfig, param, register


@register("arm")
@dataclass
class ARMConfig(SamplerConfig):
    """Autoregressive decoding with a KV cache, token for token transformers' `generate`; greedy by
    default. A sampling setting left None takes the checkpoint's generation_config.json value,
    else transformers' default (temperature 1, top_k 50, top_p 1, no min_p), as `generate` does."""

    TASK_LENGTHS: ClassVar[dict] = {"gsm8k": 256, "humaneval": 512}
    PAPER: ClassVar[dict] = dict(do_sample=False)  # greedy
    TRAINED: ClassVar[dict] = dict(do_sample=False)

    max_new_tokens: int = param(32, int, "tokens to generate", min=1)
    do_sample: bool = param(False, bool, "sample instead of greedy")
    temperature: float | None = param(None, float, "sampling temperature (with do_sample; unset: the checkpoint's, "
                                      "else 1)", min=0)
    top_p: float | None = param(None, float, "nucleus sampling mass (0: the top token only; unset: the "
                                "checkpoint's, else 1 = off)", min=0, max=1)
    top_k: int | None = param(None, int, "sample among the top-k tokens (0: all; unset: the checkpoint's, else 50)",
                              min=0)
    min_p: float | None = param(None, float, "drop tokens below min_p x the top token's probability (unset: the "
                                "checkpoint's, else off)", min=0, max=1)
    eos_token_id: int | list[int] | None = param(None, "ids", "stop token id(s) (default: the model's)")
    pad_token_id: int | None = param(None, int, "fills a finished row (default: the model's pad, else the first "
                                     "stop id)", min=0)

    def check(self) -> None:
        if self.do_sample and self.temperature is not None and not self.temperature > 0:
            raise ValueError(f"do_sample=True needs temperature > 0, got {self.temperature}")
