"""Received attention in explicit units: the analysis' door to the sink rule (sinklens/rule/).

The trace stores, per (step, layer, head), the column sums r_j = Σ_i A[i, j] over the summed
query rows i. Every unit (`UNITS`, declared in rule/spec.py) is a normalisation of r_j that
knows which keys those rows could see (`Visibility`: causal, windows, blocks, padding); keys no
summed row could see score 0 and are never compared.
"""
from __future__ import annotations

import numpy as np

from sinklens.rule import np_rule
from sinklens.rule.spec import DEFAULT_UNITS, UNITS, Visibility, check_units  # noqa: F401 (re-exported)


def _visibilities(L: int, causal: bool, visibility) -> list[Visibility]:
    if visibility is None:
        return [Visibility(causal=causal)] * L
    return list(visibility) if isinstance(visibility, (list, tuple)) else [visibility] * L


def scores(received, *, units: str = DEFAULT_UNITS, query_positions=None, key_mask=None, causal: bool = False,
           visibility=None) -> np.ndarray:
    """Scores of every key in `units`, same shape as `received` (L, H, S), (H, S) or (S,).

    query_positions: (Q,) absolute positions of the summed query rows (default: every real key).
    key_mask: (S,) real keys (default: all). causal: query i sees only keys j ≤ i.
    visibility: a `Visibility` (or one per layer) for windows and blocks; overrides `causal`.
    """
    check_units(units)
    r = np.asarray(received, dtype=np.float32)
    S = r.shape[-1]
    key_mask = np.ones(S, bool) if key_mask is None else np.asarray(key_mask, bool)
    if key_mask.shape != (S,):
        raise ValueError(f"key_mask must be (S,) = ({S},), got {key_mask.shape}")
    q = np.flatnonzero(key_mask) if query_positions is None else np.asarray(query_positions)
    lead = r.reshape((-1,) + r.shape[-2:]) if r.ndim >= 2 else r.reshape(1, 1, S)    # (L, H, S)
    cov = np_rule.coverage(q, key_mask, _visibilities(lead.shape[0], causal, visibility))
    return np_rule.to_scores(lead, units, cov).reshape(r.shape)


def uniform_expectation(query_positions, key_mask, causal: bool = False, visibility=None) -> np.ndarray:
    """(S,) r_j under uniform attention. Causal with every position a query: H_S − H_j."""
    key_mask = np.asarray(key_mask, bool)
    cov = np_rule.coverage(np.asarray(query_positions), key_mask, _visibilities(1, causal, visibility))
    return cov.expected[0]
