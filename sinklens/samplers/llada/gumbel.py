"""LLaDA's token noise (Gumbel-max in float64), shared by its sampler (sample.py) and the Fast-dLLM
cached decoding (fast.py); its reveal schedule is sinklens/samplers/schedules.py's `spread_masks`."""
from __future__ import annotations

import torch


def add_gumbel_noise(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """Gumbel-max in float64: argmax(exp(l) / (-log U)^T) samples softmax(l / T).

    float64 because low-precision Gumbel noise hurts generation quality (LLaDA, after
    arXiv:2409.02908). Returns `logits` itself when temperature is 0.
    """
    if temperature == 0:
        return logits
    logits = logits.to(torch.float64)
    u = torch.rand_like(logits, dtype=torch.float64)  # the one RNG draw of this function
    return logits.exp() / (-torch.log(u)) ** temperature
