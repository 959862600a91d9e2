"""The one protocol every per-step analysis follows, and the step it reads.

`analyze()` reads a trace step by step, computes the step's scores and Eq. 3 margins once
(`Step`), and hands the step to each accumulator in `analyze.ACCUMULATORS`:

    class MyAnalysis(Accumulator):
        name = "my_analysis"                    # key in Analysis.extra and in Analysis.to_dict()
        def __init__(self, source, config): ... # the Source (num_layers, layout, ...) and AnalysisConfig
        def add(self, step: Step) -> None: ...  # one step; keep (T, L, H)-sized summaries, never (T, L, H, S)
        def result(self) -> dict: ...           # {"my_analysis": value}: attributes of the Analysis
        def to_dict(self) -> dict: ...          # {"my_analysis": JSON}: its part of Analysis.to_dict()
        def corpus(self, num_steps) -> dict: ...  # optional: this trace's part of a corpus run's totals

A new analysis is one file with such a class and one entry in `ACCUMULATORS`; its result is
`a.extra["my_analysis"]` (built-in accumulators fill the named Analysis attributes instead).

Corpus runs (`sinklens trace --prompts`, sinklens/analysis/corpus.py) keep, per prompt, only
`corpus()` of every accumulator: numbers that add over prompts. The default sums every per-step
numeric result (an array whose first axis is the step) over the steps, beside the count of its
finite values, so a corpus mean is `sum / n`; a new accumulator is streamed without any edit.
Override it where a sum over steps means nothing (positions) or where more can be kept, and
name what stays per trace in `not_streamed` (the corpus report lists it: "per trace only").
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sinklens.analysis.source import StepData


@dataclass
class Step:
    """One step as every accumulator sees it; computed once per step by `analyze()`."""

    index: int                  # 0 .. T−1 (the trace's step number is data.step)
    data: StepData              # the source's arrays of this step
    scores: np.ndarray          # (L, H, S) in the analysis units (0 on keys no summed query could see)
    margin: np.ndarray          # (L, H, S) Eq. 3 margin score_j − mean of the other visible keys (−inf: not visible)
    flagged: np.ndarray         # (L, H, S) bool, margin ≥ ε (Eq. 3 sinks)
    visible: np.ndarray         # (L, S) bool real keys some summed query of the layer could see


class Accumulator:
    """Base class: the protocol (see the module docstring). `for_analysis` builds one per analysis."""

    name: str = ""
    not_streamed: str = ""      # what corpus() leaves out and why, e.g. "the lens rows (tokens do not add)"

    @classmethod
    def for_analysis(cls, source, config) -> "Accumulator":
        return cls(source, config)

    def add(self, step: Step) -> None:
        raise NotImplementedError

    def result(self) -> dict:
        raise NotImplementedError

    def to_dict(self) -> dict:
        return {}

    def corpus(self, num_steps: int) -> dict:
        """This trace's part of a corpus total (module docstring): {result name: {"sum", "n"}} for
        every numeric result with one entry per step, summed over the steps (NaN skipped)."""
        out = {}
        for key, value in self.result().items():
            if (isinstance(value, np.ndarray) and value.ndim >= 1 and value.shape[0] == num_steps
                    and value.dtype.kind in "biuf"):
                out[key] = step_sum(value)                                      # (T, ...) -> (...)
        return out


def step_sum(x) -> dict:
    """{"sum", "n"}: an array (T, ...) summed over its steps, NaN skipped, beside the count of its
    finite values (the default corpus part of one result; a corpus mean is sum / n)."""
    x = np.asarray(x, np.float64)
    finite = np.isfinite(x)
    return {"sum": np.where(finite, x, 0.0).sum(axis=0), "n": finite.sum(axis=0)}


def rounded(x, nd: int = 4):
    """JSON-ready nested lists of floats rounded to `nd` digits, None for NaN / inf."""
    x = np.asarray(x, dtype=float)
    if x.ndim <= 1:
        return [None if not np.isfinite(v) else round(float(v), nd) for v in x.ravel()]
    return [rounded(r, nd) for r in x]
