"""How much attention the sinks absorb, and how far their positions wander over the trajectory.

- absorption rate (Attention Floating, arXiv 2601.07894): per (step, layer, head) the share of the
  summed query rows' attention that the Eq. 3 sinks receive, Σ_{j ∈ sinks} r_j / Σ_j r_j (0..1;
  column sums, so independent of the score units; 0 where the head has no sink);
- sink-position variance (Sink-Aware Pruning, arXiv 2602.17664): per (layer, head) the variance
  over steps of the largest sink's position (positions², over the steps that have a sink).
"""
from __future__ import annotations

import warnings

import numpy as np

from sinklens.analysis.accumulate import Accumulator, Step, rounded, step_sum


def absorption(step: Step) -> np.ndarray:
    """(L, H) Σ_{j ∈ Eq. 3 sinks} r_j / Σ_j r_j at this step (0 where no attention was summed)."""
    r = np.asarray(step.data.received, np.float64)
    total = r.sum(-1)
    out = np.zeros(total.shape)
    np.divide(np.where(step.flagged, r, 0.0).sum(-1), total, out=out, where=total > 0)
    return out


class Absorption(Accumulator):
    """(T, L, H) absorption rate and the largest sink's position; per (L, H) its variance over steps."""

    name = "absorption"
    not_streamed = "the sink-position variance (positions over one prompt's steps do not add over prompts)"

    def __init__(self, source, config):
        shape = (source.num_steps, source.num_layers, source.num_heads)
        self.rate = np.zeros(shape)
        self.largest = np.full(shape, -1, np.int64)

    def add(self, step: Step) -> None:
        self.rate[step.index] = absorption(step)
        best = np.where(step.flagged, step.scores, -np.inf)             # (L, H, S)
        has = step.flagged.any(-1)
        self.largest[step.index] = np.where(has, best.argmax(-1), -1)

    def position_variance(self) -> np.ndarray:
        """(L, H) variance over steps of the largest sink's position; NaN with fewer than 2 such steps."""
        pos = np.where(self.largest >= 0, self.largest, np.nan).astype(float)
        n = np.isfinite(pos).sum(0)
        with warnings.catch_warnings():                                # heads with no sink: all-NaN columns
            warnings.simplefilter("ignore", RuntimeWarning)
            var = np.nanvar(pos, axis=0)
        return np.where(n >= 2, var, np.nan)

    def result(self) -> dict:
        return {"absorption": self}

    def corpus(self, num_steps: int) -> dict:
        """(L, H) absorption summed over steps; the position variance is per trace (it does not add)."""
        return {"absorption": {"rate": step_sum(self.rate)}}

    def to_dict(self) -> dict:
        var = self.position_variance()
        return {"absorption": {
            "units": "absorption: share of the summed rows' attention the Eq. 3 sinks receive (0..1); "
                     "position variance: positions² over the steps with a sink",
            "mean": round(float(self.rate.mean()), 4),
            "per_step_mean": rounded(self.rate.mean(axis=(1, 2))),
            "layer_head_mean": rounded(self.rate.mean(axis=0)),
            "position_variance": rounded(var),
            "mean_position_variance": None if not np.isfinite(var).any() else round(float(np.nanmean(var)), 4)}}
