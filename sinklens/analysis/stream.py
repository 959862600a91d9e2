"""A prompt's corpus part folded step by step, with no trace (corpus runs, sinklens/eval/corpus.py).

`analyze()` + `prompt_part()` read a whole trace and keep (T, L, H) summaries; a corpus run needs
only the part, and every number in it is a sum over steps. `PromptStream` takes the steps as the
sampler produces them and gives the same part, number for number:

    s = PromptStream(meta, AnalysisConfig(units="scaled_sum"))   # meta: the trace metadata
    for d in steps:                                               # StepData, as TraceSource reads
        s.add(d)                                                  # them back from the trace
    s.part()                                                      # == prompt_part(analyze(trace))

Each analysis folds its part (`Accumulator.corpus_stream`, sinklens/analysis/accumulate.py) and
the dynamics counts fold with `DynamicsCounts` (sinklens/analysis/dynamics.py). Kept across
steps: O(L·H·(S + bins)) numbers (running sums, the dynamics' open tracks, the previous step's
sinks), the sink tokens' counts and strings, and 8 bytes a step for each per-step number numpy
sums pairwise (the k·σ and mask-ranking series); never a (T, L, H) array. A run must record the
same readouts at every step (a run's capture options do): a readout present at some steps only
would order its part's keys by first appearance.
"""
from __future__ import annotations

import numpy as np

from sinklens.analysis.analyze import AnalysisConfig, accumulator_classes, make_step
from sinklens.analysis.corpus import join_part
from sinklens.analysis.dynamics import DynamicsCounts
from sinklens.analysis.sinks import largest_flagged
from sinklens.analysis.source import AnalysisInputError, Source, StepData, trace_facts


class StreamSource(Source):
    """The Source each analysis of a stream is built on: the trace metadata's facts, one step (an
    analysis sees one step at a time), token strings from the vocabulary seen so far (a trace's
    `tokens_vocab`: the strings of the ids on its canvases)."""

    def __init__(self, meta: dict, num_layers: int, num_heads: int, vocab: dict, label: str = "stream"):
        super().__init__(num_steps=1, num_layers=num_layers, num_heads=num_heads, label=label, meta=meta,
                         **trace_facts(meta, label))
        self.vocab = vocab

    def decode(self, ids) -> list[str]:
        return [self.vocab.get(str(int(i)), f"<{int(i)}>") for i in np.atleast_1d(ids)]


class PromptStream:
    """One prompt's corpus part in one analysis config, folded step by step (module docstring).
    meta: the trace metadata (JSON types); vocab: id (str) -> string of the ids seen so far, filled
    by the caller as steps come (read when the part is made); extra: accumulator classes beyond
    ACCUMULATORS, as `analyze(extra=...)`."""

    def __init__(self, meta: dict, config: AnalysisConfig | None = None, vocab: dict | None = None,
                 extra: tuple = ()):
        self.meta, self.config = meta, config or AnalysisConfig()
        self.vocab = {} if vocab is None else vocab
        self.extra = extra
        self.streams = None
        self.num_steps = 0

    def _start(self, d: StepData) -> None:
        L, H = (int(self.meta.get(k) or n) for k, n in zip(("num_layers", "num_heads"), d.received.shape[:2]))
        self.shape = (L, H)
        src = StreamSource(self.meta, L, H, self.vocab)
        self.visibilities = src.layout.visibilities(L)
        self.streams = [(cls, cls.corpus_stream(src, self.config)) for cls in accumulator_classes(self.extra)]
        self.dynamics = DynamicsCounts(L, H, max_move=self.config.max_move, static_fraction=self.config.static_fraction)

    def add(self, d: StepData) -> None:
        """The next step (steps in the order of their step numbers, as a trace is read)."""
        if self.streams is None:
            self._start(d)
        step = make_step(self.num_steps, d, self.config, self.visibilities, self.shape)
        for _, s in self.streams:
            s.add(step)
        self.dynamics.add(largest_flagged(step.scores, step.flagged)[0], step.flagged, step.scores)
        self.num_steps += 1

    def part(self) -> dict:
        """The prompt's part: `prompt_part(analyze(trace))` of the trace these steps make."""
        if self.streams is None:
            raise AnalysisInputError("the run produced no step to analyse")
        part: dict = {}
        for cls, s in self.streams:
            join_part(part, cls, s.part(), bool(cls.not_streamed) and s.has_result())
        part["dynamics"] = self.dynamics.part()
        return part
