"""The mean + k·σ sink rule beside Eq. 3 (Sink-Aware Pruning, arXiv 2602.17664).

Per step, one mass per key: the mean over heads of its score (the analysis units), summed over
layers; a key is a k·σ sink when its mass is at least mean + k·σ over the visible keys
(rule/spec.py declares the rule and k; rule/np_rule.py computes it). Beside it, the keys Eq. 3
flags in at least one (layer, head) at the same step, and their agreement (Jaccard).
"""
from __future__ import annotations

import numpy as np

from sinklens.analysis.accumulate import Accumulator, Step, rounded, step_sum
from sinklens.rule import np_rule
from sinklens.rule.spec import DEFAULT_K_SIGMA, K_SIGMA_RULE


class KSigma(Accumulator):
    """Per step: the k·σ sinks, the threshold, the Eq. 3 keys (any head) and their Jaccard agreement."""

    name = "k_sigma"

    def __init__(self, source, config, k: float = DEFAULT_K_SIGMA):
        self.k, self.units = k, config.units
        self.positions: list[np.ndarray] = []        # per step: k·σ sink positions
        self.eq3_positions: list[np.ndarray] = []    # per step: keys Eq. 3 flags in some (layer, head)
        self.threshold = np.full(source.num_steps, np.nan)
        self.jaccard = np.full(source.num_steps, np.nan)

    def add(self, step: Step) -> None:
        visible = step.visible.any(axis=0)                               # (S,) seen in some layer
        mass = np_rule.k_sigma_mass(step.scores, step.visible)          # (S,)
        flagged, self.threshold[step.index] = np_rule.k_sigma_sinks(mass, visible, self.k)
        eq3 = step.flagged.any(axis=(0, 1))                              # (S,)
        union = (flagged | eq3).sum()
        if union:
            self.jaccard[step.index] = (flagged & eq3).sum() / union
        self.positions.append(np.flatnonzero(flagged))
        self.eq3_positions.append(np.flatnonzero(eq3))

    def result(self) -> dict:
        return {"k_sigma": self}

    def corpus(self, num_steps: int) -> dict:
        """Per step: k·σ sinks, Eq. 3 keys (any head), their Jaccard; summed over steps (corpus runs)."""
        return {"k_sigma": {"sinks_per_step": step_sum([len(p) for p in self.positions]),
                            "eq3_any_head_per_step": step_sum([len(p) for p in self.eq3_positions]),
                            "jaccard": step_sum(self.jaccard)}}

    def to_dict(self) -> dict:
        return {"k_sigma": {"rule": K_SIGMA_RULE, "k": self.k, "units": self.units,
                            "threshold_per_step": rounded(self.threshold),
                            "sinks_per_step": [p.tolist() for p in self.positions],
                            "eq3_any_head_per_step": [p.tolist() for p in self.eq3_positions],
                            "jaccard_per_step": rounded(self.jaccard),
                            "mean_jaccard": _nanmean(self.jaccard),
                            "mean_sinks_per_step": float(np.mean([len(p) for p in self.positions]))}}


def _nanmean(x) -> float | None:
    x = np.asarray(x, float)
    return None if not np.isfinite(x).any() else round(float(np.nanmean(x)), 4)
