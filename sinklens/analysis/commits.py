"""The paper's §5.2 hypothesis, read from a trace: how confidently each step committed its tokens.

The paper: "when a sink is masked, the model likely becomes less confident about those tokens ...
and therefore not consider them for unmasking". A diffusion sampler's trace stores, per step, the
probability its logits gave each token it committed (`commit_prob`, sinklens/trace/commits.py).
This analysis keeps, per step, their mean and count; a masked and an unmasked trace of the same
prompt are compared by `sinklens.trace.commits.deferrals` (and, over an evaluation, by the
outcome readouts `deferred` / `commit_prob_change`, sinklens/eval/outcomes.py).
"""
from __future__ import annotations

import numpy as np

from sinklens.analysis.accumulate import Accumulator, Step, rounded


class CommitConfidence(Accumulator):
    """Per step: the mean probability of the tokens it committed (NaN: none) and how many it committed.
    None for a trace without the column (an ARM's, an older trace)."""

    name = "commit_confidence"

    def __init__(self, source, config):
        self.mean = np.full(source.num_steps, np.nan, np.float32)   # (T,)
        self.count = np.zeros(source.num_steps, np.int32)            # (T,)
        self.recorded = False

    def add(self, step: Step) -> None:
        p = step.data.commit_prob
        if p is None:
            return
        self.recorded = True
        p = np.asarray(p, np.float32)
        p = p[np.isfinite(p)]
        self.count[step.index] = p.size
        if p.size:
            self.mean[step.index] = p.mean()

    def result(self) -> dict:
        return {"commit_confidence": self if self.recorded else None}

    def overall(self) -> float:
        """Mean over every committed token of the run (NaN: none)."""
        n = self.count.sum()
        return float(np.nansum(self.mean * self.count) / n) if n else float("nan")

    def corpus(self, num_steps: int) -> dict:
        if not self.recorded:
            return {}
        committed = np.where(self.count > 0, self.mean.astype(np.float64) * self.count, 0.0)   # (T,)
        return {"commit_confidence": {"sum": committed.sum(), "n": int(self.count.sum())}}   # corpus mean = sum / n

    def to_dict(self) -> dict:
        if not self.recorded:
            return {"commit_confidence": None}
        return {"commit_confidence": {
            "units": "probability the step's logits gave each token it committed (the paper's §5.2)",
            "mean": rounded([self.overall()])[0], "commits": int(self.count.sum()),
            "per_step_mean": rounded(self.mean), "per_step_count": self.count.tolist()}}
