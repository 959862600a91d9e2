"""Which keys are sinks: the paper's Eq. 3, top-K ranking, and the ε sweep (Fig. 10).

Eq. 3: key j is a sink when  score_j − mean_{k ≠ j} score_k ≥ ε  (mean over the other *real*
keys). ε = 3 by default and applied to column sums (`units="sum"`): with the paper's written
mean r_j / S (≤ 1) the rule with ε = 3 could never fire, while on sums uniform attention gives
every key 1, so ε = 3 reads "at least three more queries' worth of attention than the average
other key" — which is what the paper's Fig. 3 / Fig. 10 (x-axis up to ~50, ≥ 96 % of a 64-token
sequence filtered) show. Padded keys are never sinks and do not enter the mean.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sinklens.analysis.accumulate import Accumulator

DEFAULT_EPS = 3.0


def _key_mask(scores: np.ndarray, key_mask) -> np.ndarray:
    S = scores.shape[-1]
    if key_mask is None:
        return np.ones(S, bool)
    key_mask = np.asarray(key_mask, bool)
    if key_mask.shape[-1] != S:
        raise ValueError(f"key_mask must end with S = {S} keys, got shape {key_mask.shape}")
    return key_mask


def sink_margin(scores, key_mask=None) -> np.ndarray:
    """score_j − mean of the other real keys' scores, shape (..., S); −inf on padded keys and
    when there is no other real key (a single token cannot be an outlier)."""
    s = np.asarray(scores, dtype=np.float64)
    km = _key_mask(s, key_mask)
    s = np.where(km, s, 0.0)
    n = km.sum(axis=-1, keepdims=True)                  # (..., 1) real keys
    total = s.sum(axis=-1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        others = (total - s) / (n - 1)
    margin = s - others
    return np.where(km & (n > 1), margin, -np.inf)


def is_sink(scores, eps: float = DEFAULT_EPS, key_mask=None) -> np.ndarray:
    """(..., S) bool: Eq. 3 with threshold `eps` (in the units of `scores`)."""
    return sink_margin(scores, key_mask) >= eps


def top_k(scores, k: int, key_mask=None) -> np.ndarray:
    """(..., k) positions of the k highest-scoring real keys, best first (ties: lower position
    first); −1 where there are fewer than k real keys."""
    if k < 1:
        raise ValueError(f"k must be ≥ 1, got {k}")
    s = np.asarray(scores, dtype=np.float64)
    km = _key_mask(s, key_mask)
    s = np.where(km, s, -np.inf)
    order = np.argsort(-s, axis=-1, kind="stable")[..., :k]
    picked = np.take_along_axis(s, order, axis=-1)
    out = np.where(np.isfinite(picked), order, -1)
    if out.shape[-1] < k:  # fewer keys than k at all
        pad = np.full(out.shape[:-1] + (k - out.shape[-1],), -1)
        out = np.concatenate([out, pad], axis=-1)
    return out


def largest_flagged(scores, flagged) -> tuple[np.ndarray, np.ndarray]:
    """Position (−1 when nothing is flagged) and score (NaN then) of the highest-scoring flagged key."""
    s = np.asarray(scores)
    pos = np.where(flagged, s, -np.inf).argmax(axis=-1)
    has = flagged.any(axis=-1)
    score = np.take_along_axis(s, pos[..., None], axis=-1)[..., 0]
    return np.where(has, pos, -1), np.where(has, score, np.nan)


def largest_sink(scores, eps: float = DEFAULT_EPS, key_mask=None) -> tuple[np.ndarray, np.ndarray]:
    """Position (−1 when no sink) and score (NaN when no sink) of the highest-scoring sink, shape (...)."""
    s = np.asarray(scores, dtype=np.float64)
    return largest_flagged(s, is_sink(s, eps, key_mask))


@dataclass
class EpsSweep:
    """Fraction of real tokens flagged by Eq. 3 as ε varies (paper Fig. 10). Non-increasing in ε."""

    eps: np.ndarray       # (E,) thresholds, in `units`
    fraction: np.ndarray  # (E,) flagged / n_tokens
    n_tokens: int         # real (step, layer, head, key) cells counted
    units: str

    def to_dict(self) -> dict:
        return {"units": self.units, "eps": self.eps.tolist(), "fraction_flagged": self.fraction.tolist(),
                "n_tokens": self.n_tokens,
                "meaning": "fraction of real (step, layer, head, key) cells with score_j − mean(others) ≥ eps"}


class EpsSweepAccumulator(Accumulator):
    """Accumulate sink margins chunk by chunk (e.g. step by step) into an ε sweep (Fig. 10)."""

    name = "eps_sweep"

    @classmethod
    def for_analysis(cls, source, config) -> "EpsSweepAccumulator":
        return cls(config.eps_values, config.units)

    def __init__(self, eps_values, units: str):
        self.eps = np.asarray(eps_values, dtype=np.float64)
        if self.eps.ndim != 1 or self.eps.size == 0:
            raise ValueError("eps_values must be a non-empty 1-D sequence")
        self.units = units
        self.counts = np.zeros(self.eps.size, np.int64)
        self.n = 0

    def add(self, step) -> None:
        self.add_margins(step.margin)

    def add_margins(self, margins: np.ndarray) -> None:
        m = margins[margins > -np.inf].ravel()                  # real keys only
        # flagged(eps) = #{m ≥ eps}: how many grid values each margin reaches, then a reverse
        # cumulative count — exactly monotone, and O(N log E) rather than sorting all N margins
        order = np.argsort(self.eps, kind="stable")
        reach = np.searchsorted(self.eps[order], m, side="right")       # (N,) grid values ≤ m
        hist = np.bincount(reach, minlength=self.eps.size + 1)          # (E + 1,)
        flagged_sorted = np.cumsum(hist[::-1])[::-1][1:]                # (E,) #{reach > e}
        self.counts[order] += flagged_sorted
        self.n += m.size

    def sweep(self) -> EpsSweep:
        frac = self.counts / self.n if self.n else np.zeros_like(self.eps)
        return EpsSweep(eps=self.eps.copy(), fraction=frac, n_tokens=self.n, units=self.units)

    def result(self) -> dict:
        return {"eps_sweep": self.sweep()}

    def to_dict(self) -> dict:
        return {"eps_sweep": self.sweep().to_dict()}


def eps_sweep(scores, eps_values=None, key_mask=None, units: str = "sum") -> EpsSweep:
    """Fraction of real keys flagged by Eq. 3 for each ε, over every leading axis of `scores`."""
    eps_values = np.linspace(0, 10, 41) if eps_values is None else eps_values
    acc = EpsSweepAccumulator(eps_values, units)
    acc.add_margins(sink_margin(scores, key_mask))
    return acc.sweep()
