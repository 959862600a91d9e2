"""The sink rule in torch, batched, on the model's device (the logit lens' sink positions, attention/readouts.py;
sink masking uses rule/np_rule.py). The same rule as rule/np_rule.py
(declarations in rule/spec.py); `tests/test_rule_parity.py` checks that the two agree.

Shapes: L layers, B batch rows, H heads, S key positions. The summed query rows are given as a
(B, S) bool mask over positions (a query row's position is the key position it sits at).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from sinklens.rule.spec import DEFAULT_EPS, Visibility, check_units


@dataclass
class Coverage:
    n_queries: torch.Tensor  # (L, B) summed query rows that see at least one key
    seen: torch.Tensor       # (L, B, S) summed queries that see key j
    expected: torch.Tensor   # (L, B, S) r_j under uniform attention
    visible: torch.Tensor    # (L, B, S) bool real keys seen by at least one summed query

    @property
    def n_visible(self) -> torch.Tensor:  # (L, B)
        return self.visible.sum(-1)


def key_bounds(S: int, vis: Visibility, q0: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(lo, hi) (B, S) inclusive key range of a query at each position; q0 (B,) first summed query."""
    i = torch.arange(S, device=q0.device).expand(q0.shape[0], S)     # (B, S)
    lo = torch.zeros_like(i)
    hi = i.clone() if vis.causal else torch.full_like(i, S - 1)
    if vis.block:
        hi = torch.minimum(hi, (i // vis.block + 1) * vis.block - 1)
    if vis.window:
        w = vis.window
        if vis.window_kind == "causal":
            lo = torch.maximum(lo, i - w + 1)
        elif vis.window_kind == "symmetric":
            lo, hi = torch.maximum(lo, i - w), torch.minimum(hi, i + w)
        else:  # "cache": the keys kept before the block being denoised
            lo = torch.maximum(lo, (q0 - w + 1)[:, None].expand_as(lo))
    return lo, hi.clamp(max=S - 1)


def _one_layer(queries: torch.Tensor, real: torch.Tensor, vis: Visibility):
    """(seen, expected, Q) for one layer: (B, S), (B, S), (B,)."""
    B, S = real.shape
    has_q = queries.any(-1)
    q0 = torch.where(has_q, queries.float().argmax(-1), torch.zeros_like(has_q, dtype=torch.long))
    lo, hi = key_bounds(S, vis, q0)
    real_before = torch.nn.functional.pad(real.long().cumsum(-1), (1, 0))      # (B, S + 1) real keys < p
    n_vis = torch.where(hi >= lo, real_before.gather(-1, hi + 1) - real_before.gather(-1, lo.clamp(max=S)),
                        torch.zeros_like(lo))                                   # (B, S) keys each query sees
    sees = queries & (n_vis > 0)
    weight = torch.where(sees, 1.0 / n_vis.clamp(min=1).double(), torch.zeros((), dtype=torch.float64))
    out = []
    for value in (sees.double(), weight):
        diff = torch.zeros(B, S + 1, dtype=torch.float64, device=real.device)
        diff.scatter_add_(-1, lo.clamp(max=S), value)                          # +value from lo_i ...
        diff.scatter_add_(-1, (hi + 1).clamp(min=0), -value)                   # ... through hi_i
        out.append(diff.cumsum(-1)[:, :S] * real)
    return out[0], out[1], sees.sum(-1)


def coverage(queries: torch.Tensor, real: torch.Tensor, visibilities: list[Visibility]) -> Coverage:
    """Coverage of one step: queries (B, S) bool summed rows, real (B, S) bool real keys."""
    queries, real = queries.bool() & real.bool(), real.bool()
    done = {}
    for v in visibilities:
        if v not in done:
            done[v] = _one_layer(queries, real, v)
    seen, expected, n_q = (torch.stack([done[v][k] for v in visibilities]) for k in range(3))
    return Coverage(n_queries=n_q, seen=seen, expected=expected, visible=seen > 0)


def to_scores(received: torch.Tensor, units: str, cov: Coverage) -> torch.Tensor:
    """Scores (L, B, H, S) float32 of column sums `received` (L, B, H, S); 0 on keys not visible."""
    check_units(units)
    r = received.double()
    per_key = lambda t: t[:, :, None, :]                                       # noqa: E731 (L, B, S) -> (L, B, 1, S)
    n_q = cov.n_queries.clamp(min=1).double()[:, :, None, None]                # (L, B, 1, 1)
    if units == "sum":
        out = r
    elif units == "mean":
        out = r / n_q
    elif units == "scaled_sum":
        out = r * cov.n_visible.double()[:, :, None, None] / n_q
    else:
        denom = per_key(cov.seen if units == "gu" else cov.expected)
        out = torch.where(denom > 0, r / denom.clamp(min=1e-300), torch.zeros((), dtype=r.dtype))
    return torch.where(per_key(cov.visible), out, torch.zeros((), dtype=r.dtype)).float()


def sink_margin(scores: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
    """score_j − mean of the other visible keys, (..., S) float64; −inf where j is not visible
    or is the only visible key. visible: bool, broadcastable to `scores`."""
    vis = visible.expand_as(scores)
    s = torch.where(vis, scores.double(), torch.zeros((), dtype=torch.float64))
    n = vis.sum(-1, keepdim=True)
    others = (s.sum(-1, keepdim=True) - s) / (n - 1).clamp(min=1)
    return torch.where(vis & (n > 1), s - others, torch.full((), -math.inf, dtype=torch.float64))


def is_sink(scores: torch.Tensor, visible: torch.Tensor, eps: float = DEFAULT_EPS) -> torch.Tensor:
    """(..., S) bool: Eq. 3 at threshold `eps` (in the units of `scores`)."""
    return sink_margin(scores, visible) >= eps
