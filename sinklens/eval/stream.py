"""A corpus run's prompt reduced as the sampler runs, with no trace written unless it is kept.

    w = StreamWriter(units="scaled_sum", sink_eps=3.0, keep="OUT/traces/000003.arrow")  # keep: or None
    m.generate(ids, trace=w, capture=capture, ...)   # w stands where the trace writer stands
    w.close()
    w.parts()        # {units: part}: what reduce_trace(the trace of this run) gives, number for number

The sampler fills `w.meta` (base.open_trace_writer) and hands it every StepEvent (`after_step`).
Each step is turned once into the numpy arrays the trace file would hold and read back
(`trace.writer.read_back`: the stored float16 / float32, received as the sum of its groups where
the writer leaves it out) and folded into the part (`analysis.stream.PromptStream`); a causal
model's run is also folded in the baseline units, as `reduce_trace` does. With `keep` the steps
also go to a TraceWriter at that path: the file `trace=path` would write.

Memory: one step's arrays and the folds' O(L·H·(S + bins)) state; disk: nothing for a prompt not kept.
"""
from __future__ import annotations

import json

import numpy as np

from sinklens.analysis.analyze import AnalysisConfig
from sinklens.analysis.corpus import to_json
from sinklens.analysis.source import AnalysisInputError, StepData
from sinklens.analysis.stream import PromptStream
from sinklens.rule.spec import BASELINE_UNITS
from sinklens.trace.layout import TraceLayout
from sinklens.trace.writer import TraceWriter, event_arrays, read_back


class StreamWriter:
    """A trace writer's stand-in that folds each step into the prompt's corpus parts (module docstring);
    batch row 0 only: a corpus run generates one prompt at a time."""

    def __init__(self, units: str, sink_eps: float, *, received_dtype: str = "float16", keep: str | None = None):
        self.units, self.sink_eps, self.received_dtype = units, sink_eps, received_dtype
        self.tee = TraceWriter(keep, received_dtype=received_dtype) if keep else None
        self._meta: dict = {}
        self._decode = None
        self.vocab: dict[str, str] = {}          # the trace's tokens_vocab: strings of the ids on the canvases
        self.seen_ids: set[int] = set()
        self.streams: list[PromptStream] | None = None
        self.last_step: int | None = None

    # what open_trace_writer fills in and the samplers read (the kept trace's writer, when there is one)
    @property
    def meta(self) -> dict:
        return self.tee.meta if self.tee else self._meta

    @property
    def decode(self):
        return self.tee.decode if self.tee else self._decode

    @decode.setter
    def decode(self, fn) -> None:
        if self.tee:
            self.tee.decode = fn
        else:
            self._decode = fn

    @property
    def path(self) -> str | None:
        return self.tee.path if self.tee else None

    def after_step(self, event) -> None:
        arrays = event_arrays(event)
        if self.tee:
            self.tee.write_step(event.step, **arrays)
        if self.last_step is not None and event.step <= self.last_step:   # a trace is read in step order
            raise ValueError(f"step {event.step} came after step {self.last_step}: a corpus run needs the steps in order")
        self.last_step = event.step
        r = read_back(arrays, self.received_dtype)
        self._learn_vocab(r["tokens"])
        if r["received"] is None:
            raise AnalysisInputError(f"step {event.step} holds no received attention: the run did not capture "
                                     "attention (trace it with capture on)")
        d = StepData(step=event.step, received=r["received"], tokens=r["tokens"], is_masked=r["is_masked"],
                     key_mask=r["attention_mask"], query_positions=r["query_positions"].astype(np.int64),
                     received_groups=r["received_groups"], learned_sink=r["learned_sink"], edited=r["edited"],
                     commit_prob=r["commit_prob"], readouts=r["readouts"])
        if self.streams is None:
            self.streams = self._start()
        for s in self.streams:
            s.add(d)

    def _start(self) -> list[PromptStream]:
        """A stream per units view, on the metadata as the trace would store it (JSON)."""
        meta = json.loads(json.dumps(self.meta, sort_keys=True))
        views = [self.units]
        first = PromptStream(meta, AnalysisConfig(units=self.units, sink_eps=self.sink_eps), self.vocab)
        streams = [first]
        if TraceLayout.from_meta(meta).causal and self.units != BASELINE_UNITS:   # reduce_trace's second view
            views.append(BASELINE_UNITS)
            streams.append(PromptStream(meta, AnalysisConfig(units=BASELINE_UNITS, sink_eps=self.sink_eps), self.vocab))
        self.views = views
        return streams

    def _learn_vocab(self, tokens: np.ndarray) -> None:
        """The strings the trace writer would store for the ids seen for the first time (one row: a
        corpus run generates one prompt at a time)."""
        if self.decode is None:
            return
        new = sorted(set(np.unique(tokens).tolist()) - self.seen_ids)
        self.seen_ids.update(new)
        if new:
            self.vocab.update({str(i): s for i, s in zip(new, self.decode(new))})

    def parts(self) -> dict:
        """{units: part} of the steps so far, as reduce_trace gives them (JSON types)."""
        if self.streams is None:
            raise AnalysisInputError("the run produced no step to analyse")
        return {units: to_json(s.part()) for units, s in zip(self.views, self.streams)}

    @property
    def num_steps(self) -> int:
        return 0 if self.streams is None else self.streams[0].num_steps

    def close(self) -> None:
        if self.tee:
            self.tee.close()

    def abandon(self) -> None:
        if self.tee:
            self.tee.abandon()
