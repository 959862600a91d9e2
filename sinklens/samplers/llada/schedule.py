"""LLaDA's token noise and reveal schedule, shared by its sampler (sample.py) and the Fast-dLLM
cached decoding (fast.py)."""
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


def num_transfer_tokens(block_is_masked: torch.Tensor, steps: int) -> torch.Tensor:
    """(B, steps) long tokens to reveal per step: the block's mask count spread evenly, the
    remainder (+1 each) to the earliest steps."""
    count = block_is_masked.sum(dim=1, keepdim=True)  # (B, 1)
    per_step, remainder = count // steps, count % steps
    schedule = per_step.expand(-1, steps).clone()  # (B, steps)
    schedule += (torch.arange(steps, device=count.device)[None, :] < remainder).long()
    return schedule
