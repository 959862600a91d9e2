"""The sink rule in numpy (the analysis of saved traces; no torch). Declarations: rule/spec.py.

Per step, the summed query rows and the layer's `Visibility` decide, for every key j:
  seen_j     how many summed queries could see j,
  E_j        r_j under uniform attention: Σ over summed queries i that see j of 1 / |keys i sees|
             (bidirectional: Q / K; causal, every position a query: H_S − H_j),
  visible_j  real and seen by at least one summed query: the keys Eq. 3 compares.
Each query sees an interval of positions [lo_i, hi_i] (minus padding), so both sums are
difference arrays over those intervals: O(Q + S) per layer, never a (Q, S) matrix.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sinklens.rule.spec import DEFAULT_EPS, DEFAULT_K_SIGMA, Visibility, check_units


@dataclass
class Coverage:
    """What the summed query rows of one step could see, per layer. L = layers, S = positions."""

    n_queries: np.ndarray    # (L,) Q: summed query rows that see at least one key
    seen: np.ndarray         # (L, S) float64 summed queries that see key j
    expected: np.ndarray     # (L, S) float64 r_j under uniform attention
    visible: np.ndarray      # (L, S) bool real keys seen by at least one summed query

    @property
    def n_visible(self) -> np.ndarray:  # (L,) K per layer (counted once: masking reads it every step)
        if getattr(self, "_n_visible", None) is None:
            self._n_visible = self.visible.sum(-1)
        return self._n_visible

    @property
    def scale(self) -> np.ndarray:  # (L, 1) K / Q per layer, the "scaled_sum" factor (made once, as n_visible)
        if getattr(self, "_scale", None) is None:
            self._scale = (self.n_visible / np.maximum(self.n_queries, 1))[:, None]
        return self._scale


def key_bounds(positions: np.ndarray, S: int, vis: Visibility, q0: int) -> tuple[np.ndarray, np.ndarray]:
    """(lo, hi): the inclusive range of key positions each query at `positions` could see.
    q0: the first summed query (the anchor of a "cache" window)."""
    i = np.asarray(positions, np.int64)
    lo = np.zeros_like(i)
    hi = i.copy() if vis.causal else np.full_like(i, S - 1)
    if vis.block:
        hi = np.minimum(hi, (i // vis.block + 1) * vis.block - 1)
    if vis.window:
        w = vis.window
        if vis.window_kind == "causal":
            lo = np.maximum(lo, i - w + 1)
        elif vis.window_kind == "symmetric":
            lo, hi = np.maximum(lo, i - w), np.minimum(hi, i + w)
        else:  # "cache": the keys kept before the block, whatever the query's own position
            lo = np.maximum(lo, q0 - w + 1)
    return lo, np.minimum(hi, S - 1)


def _one_layer(q: np.ndarray, key_mask: np.ndarray, vis: Visibility) -> tuple[np.ndarray, np.ndarray, int]:
    """(seen, expected, Q): seen and expected (S,) for query positions q under one layer's
    visibility, and Q the queries that see any key (a padded query row sees none)."""
    S = key_mask.shape[0]
    lo, hi = key_bounds(q, S, vis, int(q.min()) if q.size else 0)
    real_before = np.concatenate([[0], np.cumsum(key_mask)])            # (S + 1,) real keys < p
    n_vis = np.where(hi >= lo, real_before[hi + 1] - real_before[lo], 0)  # (Q,) keys each query sees
    sees = n_vis > 0
    weight = np.zeros(q.shape, np.float64)
    np.divide(1.0, n_vis, out=weight, where=sees)                      # each query spreads 1 over what it sees
    lo, hi = lo[sees], hi[sees]
    seen, expected = (np.cumsum(np.bincount(lo, value, S + 1) - np.bincount(hi + 1, value, S + 1))[:S]   # +value
                      for value in (np.ones(lo.shape), weight[sees]))                                    # lo_i..hi_i
    return np.where(key_mask, seen, 0.0), np.where(key_mask, expected, 0.0), int(sees.sum())


def coverage(query_positions, key_mask, visibilities: list[Visibility]) -> Coverage:
    """The Coverage of one step: query_positions (Q,) absolute positions of the summed rows,
    key_mask (S,) real keys, one Visibility per layer (layers sharing one are computed once)."""
    key_mask = np.asarray(key_mask, bool)
    S = key_mask.shape[0]
    q = np.asarray(query_positions, np.int64).reshape(-1)
    if q.size and (q.min() < 0 or q.max() >= S):
        raise ValueError(f"query_positions must lie in 0..{S - 1}, got {q.min()}..{q.max()}")
    done = {}
    for v in visibilities:
        if v not in done:
            done[v] = _one_layer(q, key_mask, v)
    seen, expected, n_q = (np.stack([np.asarray(done[v][k]) for v in visibilities]) for k in range(3))
    return Coverage(n_queries=n_q, seen=seen, expected=expected, visible=seen > 0)


def distance_expectation(query_positions, key_mask, visibilities: list[Visibility]) -> np.ndarray:
    """(L, S) float64: per layer, the attention per summed query row at each distance d = |i − j|
    under uniform attention over the keys each query sees (the same visibility as `coverage`:
    causal, blocks, windows, padding), divided by the Q summed rows (Σ over d = 1 when every row
    sees a key). The baseline of the distance profile (analysis/readouts.py)."""
    key_mask = np.asarray(key_mask, bool)
    S = key_mask.shape[0]
    q = np.asarray(query_positions, np.int64).reshape(-1)
    keys = np.arange(S)
    done = {}
    for v in visibilities:
        if v in done:
            continue
        lo, hi = key_bounds(q, S, v, int(q.min()) if q.size else 0)
        sees = (keys >= lo[:, None]) & (keys <= hi[:, None]) & key_mask  # (Q, S)
        n = sees.sum(-1, keepdims=True)
        w = np.where(sees, 1.0 / np.maximum(n, 1), 0.0)                   # each query spreads 1 over what it sees
        dist = np.abs(q[:, None] - keys)                                  # (Q, S)
        done[v] = np.bincount(dist.ravel(), weights=w.ravel(), minlength=S)[:S] / max(q.size, 1)
    return np.stack([done[v] for v in visibilities]) if visibilities else np.zeros((0, S))


def _per_key(a: np.ndarray, ndim: int) -> np.ndarray:
    """(L, S) -> (L, 1, ..., 1, S) to broadcast against scores of `ndim` dims (L, ..., S)."""
    return a.reshape(a.shape[:1] + (1,) * (ndim - 2) + a.shape[1:])


def to_scores(received, units: str, cov: Coverage) -> np.ndarray:
    """Scores (L, ..., S) float32 of column sums `received` (L, ..., S) in `units` (rule/spec.py).
    Keys that are not visible score 0 (they are never compared)."""
    check_units(units)
    # float64 arithmetic: an array's product with the float64 factors below is made in float64 as it
    # is (no conversion first); the plain sums and the divisions convert
    r = received if type(received) is np.ndarray and units == "scaled_sum" else np.asarray(received, np.float64)
    vis = _per_key(cov.visible, r.ndim)
    if units == "sum":
        out = r
    elif units == "mean":
        out = r / _per_key(np.maximum(cov.n_queries, 1)[:, None], r.ndim)
    elif units == "scaled_sum":   # the product in float64, rounded once into float32 zeros off the visible keys
        out = np.zeros(r.shape, np.float32)
        return np.multiply(r, _per_key(cov.scale, r.ndim), out=out, where=vis, casting="same_kind")
    else:
        denom = _per_key(cov.seen if units == "gu" else cov.expected, r.ndim)
        out = np.zeros_like(r)
        np.divide(r, denom, out=out, where=np.broadcast_to(denom > 0, r.shape))
    return np.where(vis, out, 0.0).astype(np.float32)


def _visible(scores, visible) -> tuple[np.ndarray, np.ndarray]:
    """(s, vis): `scores` as float64 with the keys that are not visible set to 0, and `visible` as a
    bool array of their shape (None: every key)."""
    s = np.asarray(scores, np.float64)
    if visible is None:
        visible = True
    elif np.shape(visible)[-1:] != s.shape[-1:]:
        raise ValueError(f"visible must end with S = {s.shape[-1]} keys, got shape {np.shape(visible)}")
    vis = np.broadcast_to(np.asarray(visible, bool), s.shape)
    return np.where(vis, s, 0.0), vis


def visible_total(scores, visible=None) -> np.ndarray:
    """(..., 1) float64: the sum of each row's visible scores, as `sink_margin` makes it. A caller that
    pads rows of different lengths to one (an ARM's steps) takes each row's own sum here first: a sum
    over a padded row may round differently. visible None: every key counts (scores already 0 off
    the visible keys, as `to_scores` makes them: the same sum, without the mask's copy)."""
    if visible is None:
        return np.asarray(scores, np.float64).sum(-1, keepdims=True)
    return _visible(scores, visible)[0].sum(-1, keepdims=True)


def sink_margin(scores, visible=None, total=None) -> np.ndarray:
    """score_j − mean of the other visible keys' scores, (..., S) float64; −inf where key j is
    not visible, or is the only visible key (a single key cannot be an outlier).
    visible: bool, broadcastable to `scores` (None: every key is visible). total: (..., 1) each row's
    `visible_total`, where the caller has it (rows zero-padded past their own length)."""
    s, vis = _visible(scores, visible)
    n = vis.sum(-1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        others = ((s.sum(-1, keepdims=True) if total is None else total) - s) / (n - 1)
    return np.where(vis & (n > 1), s - others, -np.inf)


def is_sink(scores, visible=None, eps: float = DEFAULT_EPS, total=None) -> np.ndarray:
    """(..., S) bool: Eq. 3 at threshold `eps` (in the units of `scores`), over the `visible` keys
    (None: all); total: as `sink_margin`'s. The one definition: the analysis, the masking and the
    readouts call this."""
    return sink_margin(scores, visible, total) >= eps


def k_sigma_mass(scores, visible) -> np.ndarray:
    """(S,) the k·σ rule's per-key mass of one step: Σ over layers of the mean over heads of
    `scores` (L, H, S); 0 on keys no layer's summed queries could see (visible (L, S))."""
    s = np.where(np.asarray(visible, bool)[:, None, :], np.asarray(scores, np.float64), 0.0)
    return s.mean(axis=1).sum(axis=0)


def k_sigma_sinks(mass, visible, k: float = DEFAULT_K_SIGMA) -> tuple[np.ndarray, float]:
    """((S,) bool, threshold): mass_j ≥ mean + k·σ over the visible keys (visible (S,) bool;
    σ the population standard deviation, as the rule's source). No visible key: none, NaN."""
    m = np.asarray(mass, np.float64)
    vis = np.asarray(visible, bool)
    if not vis.any():
        return np.zeros(m.shape, bool), float("nan")
    threshold = float(m[vis].mean() + k * m[vis].std())
    return vis & (m >= threshold), threshold
