"""Which keys to block at the next step, from one step's received attention (pure tensor math).

Input: the ranking source of step t − 1, `received` (L, B, H, S) column sums of the attention
the keys *would* have received (the softmax before any blocking; see
`AttentionRequest.received_unblocked`), and the rule's `Coverage` of the step (which keys the
summed query rows could see, per layer: sinklens/rule/torch_rule.py). Output: (L, B, H, S) bool
keys blocked at step t.

1. Scores in the configured units (rule/spec.py; default `scaled_sum`, the same as the report's).
2. Eq. 3 sinks: score_j − mean of the other visible keys ≥ ε (the rule's torch implementation).
3. Candidates: visible keys in scope ("all" | "prompt" | "generated"); Eq. 3 sinks only under
   the `eq3` protocol; scores ≥ threshold when one is set.
4. Selection: the top-K candidates per (layer, head) (or K positions ranked by the mean over
   layers and heads, `ranking="global"`); K is a count, or a share of the visible keys.
5. Control (`control="random"`): as many keys per (layer, head) as step 4 selected, drawn from
   the visible in-scope keys that are neither Eq. 3 sinks nor selected, by a random priority
   fixed for the whole generation (so the control persists the way a persistent sink would).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from sinklens.rule import torch_rule


@dataclass
class Selection:
    blocked: torch.Tensor  # (L, B, H, S) bool keys to block next step
    sinks: torch.Tensor  # (L, B, H, S) bool Eq. 3 sinks of the ranking source (for the record)
    shortfall: int = 0  # random control: keys that could not be matched (too few non-sink keys)


def _top(key: torch.Tensor, ok: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """(..., S) bool: the k (broadcast over the leading dims) highest `key` among `ok` keys.
    Ties go to the lower position (stable sort), as in the analysis' top_k."""
    key = torch.where(ok, key, torch.full_like(key, -math.inf))
    order = key.argsort(dim=-1, descending=True, stable=True)
    rank = torch.empty_like(order)
    rank.scatter_(-1, order, torch.arange(key.shape[-1], device=key.device).expand_as(order))
    return ok & (rank < k)


def select(received: torch.Tensor, cov: torch_rule.Coverage, scope: torch.Tensor, cfg,
           priority: torch.Tensor | None = None) -> Selection:
    """Keys to block next step (module docstring). received (L, B, H, S); cov the step's
    coverage ((L, B, S) visible keys); scope (B, S) bool; cfg: a MaskingConfig; priority
    (L, B, H, S) random priorities for the control."""
    L, B, H, S = received.shape
    score = torch_rule.to_scores(received, cfg.units, cov)               # (L, B, H, S)
    visible = cov.visible[:, :, None, :]                                 # (L, B, 1, S)
    sinks = torch_rule.is_sink(score, visible, cfg.sink_eps)
    in_scope = visible & scope[None, :, None, :]
    if cfg.fraction is not None:
        k = torch.ceil(cfg.fraction * cov.n_visible.float()).clamp(min=1).long()[:, :, None, None]   # (L, B, 1, 1)
    else:
        k = torch.full((1, B, 1, 1), cfg.mask_k, dtype=torch.long, device=received.device)

    if cfg.ranking == "global":
        # One ranking per row: the score averaged over layers and heads (invisible keys count 0),
        # Eq. 3 on that average over the keys some layer sees.
        seen = cov.visible.any(0)                                        # (B, S)
        mean = score.mean(dim=(0, 2))                                    # (B, S)
        cand = seen & scope & (torch_rule.is_sink(mean, seen, cfg.sink_eps) if cfg.sinks == "eq3" else True)
        if cfg.threshold is not None:
            cand = cand & (mean >= cfg.threshold)
        chosen = cand if cfg.threshold is not None else _top(mean, cand, k.amax(0)[:, :, 0])
        chosen = chosen[None, :, None, :].expand(L, B, H, S).clone()
    else:
        cand = in_scope.expand_as(score) & (sinks if cfg.sinks == "eq3" else True)
        if cfg.threshold is not None:
            cand = cand & (score >= cfg.threshold)
        chosen = cand if cfg.threshold is not None else _top(score, cand, k)

    if cfg.layers is not None:
        keep = torch.zeros(L, dtype=torch.bool, device=received.device)
        keep[list(cfg.layers)] = True
        chosen &= keep[:, None, None, None]
    if cfg.control == "none":
        return Selection(chosen, sinks)

    # Random control: the same number of keys per (layer, row, head), none of them a sink.
    n = chosen.sum(-1, keepdim=True)  # (L, B, H, 1)
    eligible = in_scope.expand_as(score) & ~sinks & ~chosen
    control = _top(priority[..., :S], eligible, n)
    shortfall = int((n.squeeze(-1) - control.sum(-1)).sum())
    return Selection(control, sinks, shortfall)
