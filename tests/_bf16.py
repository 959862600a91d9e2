"""How bfloat16 logits are compared with the official code run in bfloat16.

bfloat16 keeps 8 significant bits (~3 decimal digits): one rounding step of a value x is up to
2^-8·|x|. Two computations that differ only in summation order drift by a few such steps per
layer, so the tolerance is one rounding step of the largest official logit, and argmax must agree
wherever the official top two are further apart than that. On the fixtures sinklens' logits are
bit-identical to the official ones (measured 0.0); before the fixes of docs/models.md
("bfloat16") they were 0.039–0.094 apart at logit scale ~6, i.e. 1.7–4 steps: this tolerance
tells the two apart.
"""
from __future__ import annotations

import torch

BF16_STEP = 2.0 ** -8


def assert_bf16_logits_close(got: torch.Tensor, want: torch.Tensor, real: torch.Tensor | None = None) -> None:
    """got, want (B, S, V); real (B, S) bool: the positions compared (default all)."""
    got, want = got.float(), want.float()
    real = torch.ones(want.shape[:2], dtype=torch.bool) if real is None else real.bool()
    tol = BF16_STEP * want[real].abs().max().item()
    diff = (got - want).abs()[real].max().item()
    assert diff <= tol, f"max |Δ| {diff:.4g} > one bfloat16 step {tol:.4g}"
    top2 = want.topk(2, dim=-1).values  # (B, S, 2)
    clear = real & (top2[..., 0] - top2[..., 1] > tol)
    assert torch.equal(got.argmax(-1)[clear], want.argmax(-1)[clear])
