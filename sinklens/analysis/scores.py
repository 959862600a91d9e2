"""Received attention in explicit units (SPEC §2).

The trace stores, per (step, layer, head), the column sums r_j = Σ_i A[i, j] over the real query
rows i (Contract 4). Everything else is a normalisation of r_j:

| units            | score_j                                  | uniform attention gives | why |
|------------------|------------------------------------------|-------------------------|-----|
| `sum` (default)  | r_j                                      | S_q / S_k (= 1 when every position is a query) | "multiples of uniform attention"; the scale on which the paper's ε = 3 and Fig. 3/10 make sense |
| `mean`           | r_j / S_q                                | 1 / S_k                 | the paper's written definition (Eq. 2); ≤ 1, so ε = 3 never fires on it |
| `gu`             | r_j / #queries that can see j            | 1 / S_k (bidirectional) | Gu et al.'s causal normalisation (their ε = 0.3) |
| `uniform_ratio`  | r_j / E_uniform[r_j]                     | 1                       | removes the causal baseline: under causal uniform attention r_j = H_S − H_j |

S_q = number of query rows summed, S_k = number of real keys. Padded keys score 0 in every
unit (they are never sinks: see `sinks.py`).
"""
from __future__ import annotations

import numpy as np

UNITS: dict[str, str] = {
    "sum": "column sum r_j = Σ_i A[i,j] over real query rows (multiples of uniform attention)",
    "mean": "mean received attention r_j / S_q (the paper's written Eq. 2; ≤ 1)",
    "gu": "r_j / number of queries that can see key j (Gu et al. causal normalisation)",
    "uniform_ratio": "r_j / E[r_j] under uniform attention (causal: H_S − H_j; bidirectional: S_q/S_k)",
}

# Short axis labels for figures.
UNIT_LABELS: dict[str, str] = {
    "sum": "r_j = Σ_i A[i,j] (column sum)",
    "mean": "r_j / S_q (mean received)",
    "gu": "r_j / #queries seeing j (Gu)",
    "uniform_ratio": "r_j / uniform expectation",
}


def check_units(units: str) -> str:
    if units not in UNITS:
        raise ValueError(f"units must be one of {sorted(UNITS)}, got {units!r}")
    return units


def _visibility(query_positions: np.ndarray, key_mask: np.ndarray, causal: bool) -> tuple[np.ndarray, np.ndarray]:
    """For each key j: the number of summed queries that can see it, and the expected r_j when
    every summed query spreads its attention uniformly over the real keys it can see.

    query i sees key j when j is real and (bidirectional, or j ≤ i)."""
    key_mask = np.asarray(key_mask, bool)                # (S,)
    S = key_mask.shape[0]
    q = np.asarray(query_positions, dtype=np.int64).reshape(-1)
    if q.size and (q.min() < 0 or q.max() >= S):
        raise ValueError(f"query_positions must lie in 0..{S - 1}, got {q.min()}..{q.max()}")
    if not causal:
        n_real = int(key_mask.sum())
        seen = np.where(key_mask, q.size, 0).astype(np.float64)
        expect = np.where(key_mask, q.size / max(n_real, 1), 0.0)
        return seen, expect
    visible = np.cumsum(key_mask)                       # (S,) real keys j ≤ i
    per_query = np.zeros(S, np.float64)                 # how many summed queries sit at position i
    np.add.at(per_query, q, 1.0)
    weight = np.zeros(S, np.float64)                    # Σ over queries at i of 1 / (#keys i sees)
    np.divide(per_query, visible, out=weight, where=visible > 0)
    # key j is seen by every query at i ≥ j: reverse cumulative sums
    seen = np.where(key_mask, np.cumsum(per_query[::-1])[::-1], 0.0)
    expect = np.where(key_mask, np.cumsum(weight[::-1])[::-1], 0.0)
    return seen, expect


def uniform_expectation(query_positions, key_mask, causal: bool = False) -> np.ndarray:
    """(S,) r_j under uniform attention. Causal with every position a query: H_S − H_j."""
    return _visibility(np.asarray(query_positions), np.asarray(key_mask, bool), causal)[1]


def scores(received, *, units: str = "sum", query_positions=None, key_mask=None, causal: bool = False) -> np.ndarray:
    """Scores of every key in `units`, same shape as `received` (..., S).

    received: column sums r_j (the trace's `received`), last axis = keys.
    query_positions: (Q,) absolute positions of the summed query rows (default: every real key).
    key_mask: (S,) real keys (default: all). causal: whether query i sees only keys j ≤ i.
    """
    check_units(units)
    r = np.asarray(received, dtype=np.float32)
    S = r.shape[-1]
    key_mask = np.ones(S, bool) if key_mask is None else np.asarray(key_mask, bool)
    if key_mask.shape != (S,):
        raise ValueError(f"key_mask must be (S,) = ({S},), got {key_mask.shape}")
    if query_positions is None:
        query_positions = np.flatnonzero(key_mask)
    r = np.where(key_mask, r, 0.0).astype(np.float32)
    if units == "sum":
        return r
    if units == "mean":
        n_q = len(np.asarray(query_positions).reshape(-1))
        return (r / max(n_q, 1)).astype(np.float32)
    seen, expect = _visibility(np.asarray(query_positions), key_mask, causal)
    denom = seen if units == "gu" else expect
    out = np.zeros_like(r)
    np.divide(r, denom.astype(np.float32), out=out, where=denom > 0)
    return out
