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

A corpus run writes no trace for the prompts it does not keep: it folds each prompt's part as
the sampler produces the steps (`corpus_stream`, sinklens/analysis/stream.py), with no (T, ...)
array kept. By default each step's `corpus()` alone, added over the steps exactly as `corpus()`
sums a trace's steps (`StepFold`), so an accumulator whose part adds over steps (the default
part does) streams with no edit; one whose part does not (a count per prompt, an order over the
whole prompt) overrides `corpus_stream`.
"""
from __future__ import annotations

import array
from dataclasses import dataclass, replace

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

    def has_result(self) -> bool:
        """Whether this trace gave the analysis anything (a readout's accumulator: the run recorded it)."""
        return any(v is not None for v in self.result().values())

    @classmethod
    def corpus_stream(cls, one_step_source, config) -> "CorpusStream":
        """This analysis' corpus part folded one step at a time (module docstring); one_step_source:
        the run's Source with num_steps 1."""
        return PerStep(cls, one_step_source, config)


class CorpusStream:
    """A prompt's part of one analysis, folded step by step: `add(step)` per step, then `part()`
    (= the accumulator's `corpus(T)` on the whole trace) and `has_result()` (= its `has_result()`)."""

    def add(self, step: Step) -> None:
        raise NotImplementedError

    def part(self) -> dict:
        raise NotImplementedError

    def has_result(self) -> bool:
        return False


class PerStep(CorpusStream):
    """The default stream: the accumulator run on each step alone, its one-step parts folded."""

    def __init__(self, cls, one_step_source, config):
        self.cls, self.source, self.config = cls, one_step_source, config
        self.fold, self.seen = StepFold(), False

    def add(self, step: Step) -> None:
        acc = self.cls.for_analysis(self.source, self.config)
        acc.add(replace(step, index=0))
        self.fold.add(acc.corpus(1))
        self.seen = self.seen or (bool(acc.not_streamed) and acc.has_result())   # only read for not_streamed ones

    def part(self) -> dict:
        return self.fold.value() or {}

    def has_result(self) -> bool:
        return self.seen


class StepFold:
    """Adds one-step parts to the part of all the steps, bit for bit as `corpus()` sums a (T, ...)
    array over its steps. numpy sums a (T, n) array over T one step after another from 0 when n ≥ 2
    (running sums here), but pairwise when each step is one number (a (T,) series: its float values
    are kept, 8 bytes a step, and summed by numpy at the end). Integers add in any order; strings
    keep the first; arrays whose length grows (a distance profile) are zero-padded, as prompts are."""

    def __init__(self):
        self.total = None

    def add(self, part) -> None:
        self.total = _fold(self.total, part)

    def value(self):
        return _finish(self.total)


class _Series:
    """Single float values per step, summed at the end as numpy sums a (T,) array (pairwise)."""

    def __init__(self, x):
        self.shape, self.values = np.shape(x), array.array("d")

    def add(self, x) -> "_Series":
        self.values.append(float(np.asarray(x).reshape(())))
        return self

    def value(self):
        total = np.frombuffer(self.values, np.float64).sum(axis=0)
        return total.reshape(self.shape) if self.shape else total


def _fold(total, part):
    """total + one step's part (StepFold)."""
    if isinstance(part, dict):
        out = {} if total is None else total
        for k, v in part.items():
            out[k] = _fold(out.get(k), v)
        return out
    if isinstance(part, str) or part is None:
        return part if total is None else total
    if isinstance(part, (int, np.integer)) or (isinstance(part, np.ndarray) and part.dtype.kind in "iu"):
        return np.asarray(part) if total is None else padded_sum(total, np.asarray(part))
    x = np.asarray(part, np.float64)
    if x.size == 1 and (total is None or (isinstance(total, _Series) and total.shape == x.shape)):
        return (_Series(x) if total is None else total).add(x)
    if isinstance(total, _Series):              # the shape changed: from here on a running sum
        total = total.value()
    return padded_sum(np.zeros_like(x) if total is None else total, x)


def padded_sum(a, b):
    """a + b; arrays of the same rank and different shapes are zero-padded to the larger first
    (sums over a prompt's positions: a shorter prompt or an earlier ARM step has nothing beyond)."""
    if np.ndim(a) == np.ndim(b) and np.shape(a) != np.shape(b):
        shape = np.maximum(np.shape(a), np.shape(b))
        pad = lambda x: np.pad(x, [(0, n - m) for m, n in zip(np.shape(x), shape)])   # noqa: E731
        return pad(a) + pad(b)
    return a + b


def _finish(total):
    if isinstance(total, dict):
        return {k: _finish(v) for k, v in total.items()}
    if isinstance(total, _Series):
        return total.value()
    if isinstance(total, np.ndarray) and total.ndim == 0:
        return total[()]
    return total


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
