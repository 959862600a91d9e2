"""Sink helpers of the analysis on top of the rule (sinklens/rule/): Eq. 3 on score arrays,
top-K ranking, and the ε sweep (Fig. 10).

Eq. 3 and its default ε live in rule/spec.py, its numpy implementation in rule/np_rule.py:
`is_sink(scores, visible, eps)` and `sink_margin(scores, visible)` are that one definition,
re-exported here (`visible`: the keys some summed query could see; None = every key).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sinklens.analysis.accumulate import Accumulator
from sinklens.rule import np_rule
from sinklens.rule.np_rule import is_sink, sink_margin  # noqa: F401  (Eq. 3 has one home; re-exported)
from sinklens.rule.spec import DEFAULT_EPS, DEFAULT_UNITS


def _key_mask(scores: np.ndarray, key_mask) -> np.ndarray:
    S = scores.shape[-1]
    if key_mask is None:
        return np.ones(S, bool)
    key_mask = np.asarray(key_mask, bool)
    if key_mask.shape[-1] != S:
        raise ValueError(f"key_mask must end with S = {S} keys, got shape {key_mask.shape}")
    return key_mask


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
    return largest_flagged(s, is_sink(s, _key_mask(s, key_mask), eps))


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

    def corpus(self, num_steps: int) -> dict:
        return {"eps_sweep": {"flagged": self.counts.copy(), "keys": self.n}}         # (E,) over the ε grid


def eps_sweep(scores, eps_values=None, key_mask=None, units: str = DEFAULT_UNITS) -> EpsSweep:
    """Fraction of real keys flagged by Eq. 3 for each ε, over every leading axis of `scores`."""
    eps_values = np.linspace(0, 10, 41) if eps_values is None else eps_values
    acc = EpsSweepAccumulator(eps_values, units)
    acc.add_margins(sink_margin(scores, key_mask))
    return acc.sweep()


FLOAT16_ROUNDING = 2.0 ** -11    # float16 (a trace's default storage) rounds each value by up to this share of it


def near_threshold(score: np.ndarray, margin: np.ndarray, eps: float, rel: float = FLOAT16_ROUNDING) -> np.ndarray:
    """True where Eq. 3's verdict could flip had the scores been stored exactly: the margin lies
    within the rounding of what it is made of (score_j and the mean of the others, each rounded by
    up to `rel` of itself; scores ≥ 0, so that is rel · (score_j + mean of the others)).
    Invisible keys (margin −inf) are never near."""
    score, margin = np.asarray(score, np.float64), np.asarray(margin, np.float64)
    with np.errstate(invalid="ignore"):
        return np.abs(margin - eps) <= rel * (2 * score - margin)
