"""When each position was committed and how confidently: the paper's §5.2 hypothesis as data.

The paper (§5.2): "when a sink is masked, the model likely becomes less confident about those
tokens ... and therefore not consider them for unmasking". Two readouts answer it per run of a
diffusion sampler: the probability of every committed token at its commit step (the trace's
`commit_prob` column, `StepEvent.commit_prob`) and the step each position was committed at. Between
an unmasked and a masked run of the same prompt, `deferrals` counts the unmasked run's commits
that the masked run makes later (or never), and compares the confidence of the commits.

`Commits.from_trace` reads a traced run; `CommitRecorder` is a step hook that collects the same
without a trace (an evaluation's masked and unmasked runs).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def _np(x) -> np.ndarray:
    return x.detach().float().cpu().numpy() if hasattr(x, "detach") else np.asarray(x)


@dataclass
class Commits:
    """One batch row of a run: step (S,) int, the step at which each position was first committed
    (-1: never, e.g. the prompt); prob (S,) float32, the probability of the token committed there at
    that step (NaN where none, or where the run recorded no probability)."""

    step: np.ndarray
    prob: np.ndarray

    @classmethod
    def empty(cls, S: int) -> "Commits":
        return cls(np.full(S, -1, np.int64), np.full(S, np.nan, np.float32))

    def add(self, step: int, revealed, prob=None) -> None:
        """A step's commits: revealed (S',) bool, prob (S',) or None; positions past the current length grow it."""
        revealed = _np(revealed).astype(bool)
        if len(revealed) > len(self.step):
            grow = len(revealed) - len(self.step)
            self.step = np.concatenate([self.step, np.full(grow, -1, np.int64)])
            self.prob = np.concatenate([self.prob, np.full(grow, np.nan, np.float32)])
        new = np.flatnonzero(revealed & (self.step[:len(revealed)] < 0))  # first commit only (LLaDA2.1 edits later)
        self.step[new] = step
        if prob is not None:
            self.prob[new] = _np(prob)[new]

    @classmethod
    def from_trace(cls, trace, row: int = 0) -> "Commits":
        """A traced run's commits (a `Trace`, see sinklens.open_trace)."""
        out = cls.empty(0)
        for step in trace.steps:
            out.add(step, trace.revealed(step, row), trace.commit_prob(step, row))
        return out


class CommitRecorder:
    """A step hook that records a run's commits (per batch row) without writing a trace."""

    def __init__(self):
        self.rows: list[Commits] = []

    def after_step(self, event) -> None:
        revealed = _np(event.revealed)
        prob = None if getattr(event, "commit_prob", None) is None else _np(event.commit_prob)
        while len(self.rows) < revealed.shape[0]:
            self.rows.append(Commits.empty(0))
        for b, commits in enumerate(self.rows):
            commits.add(event.step, revealed[b], None if prob is None else prob[b])


@dataclass
class Deferrals:
    """How a masked run commits the positions an unmasked run commits (same prompt, same sampler)."""

    commits: int      # positions the unmasked run commits
    deferred: int     # of those, committed later by the masked run, or never
    advanced: int     # committed earlier by the masked run
    same: int         # committed at the same step
    prob_unmasked: float  # mean commit probability over those positions, unmasked run (NaN: not recorded)
    prob_masked: float    # the same positions' mean commit probability in the masked run
    per_step: dict    # unmasked step -> (its commits, how many of them the masked run defers)

    @property
    def deferred_share(self) -> float:
        return self.deferred / self.commits if self.commits else float("nan")


def deferrals(unmasked: Commits, masked: Commits) -> Deferrals:
    """Compare two runs' commits position by position (see `Deferrals`)."""
    S = max(len(unmasked.step), len(masked.step))
    a, b = Commits.empty(S), Commits.empty(S)
    for src, dst in ((unmasked, a), (masked, b)):
        dst.step[:len(src.step)], dst.prob[:len(src.prob)] = src.step, src.prob
    mine = a.step >= 0
    later = mine & ((b.step > a.step) | (b.step < 0))
    earlier = mine & (b.step >= 0) & (b.step < a.step)
    per_step = {int(t): (int((a.step == t).sum()), int((later & (a.step == t)).sum())) for t in np.unique(a.step[mine])}
    mean = lambda p: float(np.nanmean(p)) if np.isfinite(p).any() else float("nan")  # noqa: E731
    return Deferrals(commits=int(mine.sum()), deferred=int(later.sum()), advanced=int(earlier.sum()),
                     same=int((mine & (b.step == a.step)).sum()), prob_unmasked=mean(a.prob[mine]),
                     prob_masked=mean(b.prob[mine & (b.step >= 0)]), per_step=per_step)
