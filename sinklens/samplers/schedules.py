"""How many tokens a step transfers: every sampler's schedule, one home, as swappable pieces (dllm's
scheduler). A sampler calls its schedule by what it computes, never inlines it, so another
schedule with the same signature is a one-line swap in the sampler's loop.

    spread(total, steps)             total over steps, the remainder (+1 each) to the earliest:
                                     SDAR's and LLaDA2's quota (block_length over the steps)
    spread_masks(is_masked, steps)   the same per batch row, over each row's mask count: LLaDA's
                                     (and Fast-dLLM's) num_transfer_tokens
    linear_time(n_masked, t, s, last)  Dream's: int(n * (1 - s / t)) at time t -> s, all at the last step
"""
from __future__ import annotations

import torch


def spread(total: int, steps: int) -> list[int]:
    """Tokens per step: `total` spread evenly over `steps`, the remainder (+1 each) to the earliest
    ([] for no steps)."""
    each, rest = divmod(total, steps) if steps else (0, 0)
    return [each + (1 if i < rest else 0) for i in range(steps)]


def spread_masks(is_masked: torch.Tensor, steps: int) -> torch.Tensor:
    """(B, steps) long tokens to reveal per step: each row's mask count of `is_masked` (B, L) spread as
    `spread` does, in tensors."""
    count = is_masked.sum(dim=1, keepdim=True)  # (B, 1)
    per_step, remainder = count // steps, count % steps
    schedule = per_step.expand(-1, steps).clone()  # (B, steps)
    schedule += (torch.arange(steps, device=count.device)[None, :] < remainder).long()
    return schedule


def linear_time(n_masked, t, s, last: bool) -> int:
    """Dream's count for the step from time t to s (t > s, on linspace(1, eps, steps + 1)): the share
    1 - s / t of the masked count (a float32 batch average, as the official), all of it at the last step."""
    return int(n_masked) if last else int(n_masked * (1 - s / t))
