"""Which keys to block at the next step, from one step's received attention (pure tensor math).

Input: the ranking source of step t − 1, `received` (L, B, H, S) column sums of the attention
the keys *would* have received (the softmax before any blocking; see
`AttentionRequest.received_unblocked`). Output: (L, B, H, S) bool keys blocked at step t.

1. Units: scores are column sums divided by a per-key reference (`expected`, from the policy):
   "scaled_sum" (default) the average key's share, n_queries / n_keys, so the average key
   scores 1: exactly the column sums wherever every position is a query (DLMs, the ARM prefix
   rule; the paper's scale), and r_j × visible keys for an ARM's single newest row, whose raw
   sums are ≤ 1 (ε = 3 could never fire on them); "uniform_ratio" the key's own expectation
   under uniform attention (removes the causal baseline H_S − H_j); "sum" raw column sums.
2. Eq. 3 (paper): key j is a sink when score_j − mean_{k ≠ j} score_k ≥ ε (real keys only).
3. Candidates: real keys in scope ("all" | "prompt" | "generated"), Eq. 3 sinks only when
   `sinks="eq3"`, scores ≥ threshold when one is set.
4. Selection: the top-K candidates per (layer, head) (or K positions ranked by the mean over
   layers and heads, `ranking="global"`); K is a count, or a fraction of the row's real keys.
5. Control (`control="random"`): as many keys per (layer, head) as step 4 selected, drawn from
   the real in-scope keys that are neither Eq. 3 sinks nor selected, by a random priority fixed
   for the whole generation (so the control persists the way a persistent sink would).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass
class Selection:
    blocked: torch.Tensor  # (L, B, H, S) bool keys to block next step
    sinks: torch.Tensor  # (L, B, H, S) bool Eq. 3 sinks of the ranking source (for the record)
    shortfall: int = 0  # random control: keys that could not be matched (too few non-sink keys)


def uniform_expectation(real: torch.Tensor, queries: torch.Tensor, causal: bool) -> torch.Tensor:
    """(B, S) received attention of each key if every summed query attended uniformly.

    real: (B, S) bool real keys; queries: (B, S) bool positions whose rows were summed.
    Bidirectional: every query sees every real key, so n_queries / n_keys. Causal: query i sees
    the real keys ≤ i, so key j gets Σ_{i ≥ j, i a query} 1 / n_visible(i).
    """
    q = (queries & real).float()
    if not causal:
        n_k = real.sum(-1, keepdim=True).clamp(min=1)
        return q.sum(-1, keepdim=True) / n_k * real
    n_visible = real.long().cumsum(-1).clamp(min=1)  # (B, S) real keys at or before i
    w = q / n_visible  # each query row spreads 1 over what it sees
    return w.flip(-1).cumsum(-1).flip(-1) * real  # Σ over queries i ≥ j


def to_units(received: torch.Tensor, expected: torch.Tensor) -> torch.Tensor:
    """(L, B, H, S) scores = received / expected (B, S); −inf where expected is 0 (padding: no
    query sees the key), so those keys never rank."""
    valid = (expected > 0)[None, :, None, :]  # (1, B, 1, S)
    score = received.float() / expected.clamp(min=1e-30)[None, :, None, :]
    return torch.where(valid, score, torch.full_like(score, -math.inf))


def eq3(score: torch.Tensor, eps: float) -> torch.Tensor:
    """(..., S) bool: score_j − mean of the other valid keys ≥ eps (finite scores are the valid keys)."""
    valid = torch.isfinite(score)
    s = torch.where(valid, score, torch.zeros_like(score))
    n = valid.sum(-1, keepdim=True)
    others = (s.sum(-1, keepdim=True) - s) / (n - 1).clamp(min=1)
    return valid & (n > 1) & (s - others >= eps)


def _top(key: torch.Tensor, ok: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """(..., S) bool: the k (broadcast over the leading dims) highest `key` among `ok` keys.
    Ties go to the lower position (stable sort), as in the analysis' top_k."""
    key = torch.where(ok, key, torch.full_like(key, -math.inf))
    order = key.argsort(dim=-1, descending=True, stable=True)
    rank = torch.empty_like(order)
    rank.scatter_(-1, order, torch.arange(key.shape[-1], device=key.device).expand_as(order))
    return ok & (rank < k)


def select(received: torch.Tensor, expected: torch.Tensor, scope: torch.Tensor, cfg,
           priority: torch.Tensor | None = None) -> Selection:
    """Keys to block next step (module docstring). received (L, B, H, S); expected (B, S) the
    per-key reference of the units (0 = not a real key); scope (B, S) bool;
    cfg: a MaskingConfig; priority (L, B, H, S) random priorities for the control."""
    L, B, H, S = received.shape
    score = to_units(received, expected)
    valid = torch.isfinite(score)
    sinks = eq3(score, cfg.eps)
    in_scope = valid & scope[None, :, None, :]
    n_real = (expected > 0).sum(-1)  # (B,)
    if cfg.fraction is not None:
        k = torch.ceil(cfg.fraction * n_real.float()).clamp(min=1).long()
    else:
        k = torch.full((B,), cfg.top_k, dtype=torch.long, device=received.device)

    if cfg.ranking == "global":
        # One ranking per row: the score averaged over layers and heads, Eq. 3 on that average.
        mean = torch.where(valid, score, torch.zeros_like(score)).mean(dim=(0, 2))  # (B, S)
        mean = torch.where(valid[0, :, 0], mean, torch.full_like(mean, -math.inf))
        cand = in_scope[0, :, 0] & (eq3(mean, cfg.eps) if cfg.sinks == "eq3" else True)
        if cfg.threshold is not None:
            cand &= mean >= cfg.threshold
        chosen = cand if cfg.threshold is not None else _top(mean, cand, k[:, None])
        chosen = chosen[None, :, None, :].expand(L, B, H, S).clone()
    else:
        cand = in_scope & (sinks if cfg.sinks == "eq3" else True)
        if cfg.threshold is not None:
            cand &= score >= cfg.threshold
        chosen = cand if cfg.threshold is not None else _top(score, cand, k[None, :, None, None])

    if cfg.layers is not None:
        keep = torch.zeros(L, dtype=torch.bool, device=received.device)
        keep[list(cfg.layers)] = True
        chosen &= keep[:, None, None, None]
    if cfg.control == "none":
        return Selection(chosen, sinks)

    # Random control: the same number of keys per (layer, row, head), none of them a sink.
    n = chosen.sum(-1, keepdim=True)  # (L, B, H, 1)
    eligible = in_scope & ~sinks & ~chosen
    control = _top(priority[..., :S], eligible, n)
    shortfall = int((n.squeeze(-1) - control.sum(-1)).sum())
    return Selection(control, sinks, shortfall)
