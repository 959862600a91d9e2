"""The built-in per-step analyses, each an `Accumulator` (sinklens/analysis/accumulate.py).

Each keeps only small per-step summaries ((T, L, H) arrays, the sparse list of sinks, (T, S)
tokens), so a trace is never held in memory at once. They fill the `Analysis` attributes named
in their `result()`; their `to_dict()` parts are placed by `Analysis.to_dict()`.
"""
from __future__ import annotations

import numpy as np

from sinklens.analysis.accumulate import Accumulator, CorpusStream, Step, rounded
from sinklens.analysis.dynamics import split_events
from sinklens.analysis.sinks import largest_flagged, near_threshold
from sinklens.rule import np_rule
from sinklens.analysis.tokens import counted_token_table, sink_token_table

# Fig. 3 histogram bins (log-spaced, in the chosen units); values below the first edge count in bin 0.
HIST_EDGES = np.concatenate([[0.0], np.logspace(-3, 3, 49)])
QUANTILES = (0.5, 0.9, 0.99, 1.0)


class StepArrays(Accumulator):
    """Step numbers, lengths, query counts and the (T, S_max) tokens / mask states / real keys."""

    name = "steps"

    def __init__(self, source, config):
        T = source.num_steps
        self.step_numbers: list[int] = []
        self.seq_len, self.n_real, self.n_q = np.zeros(T, np.int32), np.zeros(T, np.int32), np.zeros(T, np.int32)
        self.toks, self.masked, self.keys = [], [], []
        self.edited: list[np.ndarray | None] = []  # per step (S,) bool, None: the sampler never edits

    def add(self, step: Step) -> None:
        d, t = step.data, step.index
        self.toks.append(d.tokens)
        self.masked.append(d.is_masked)
        self.keys.append(d.key_mask)
        self.edited.append(getattr(d, "edited", None))
        self.seq_len[t], self.n_real[t], self.n_q[t] = d.tokens.shape[0], int(d.key_mask.sum()), len(d.query_positions)
        self.step_numbers.append(d.step)

    def result(self) -> dict:
        T = len(self.toks)
        S = int(self.seq_len.max()) if T else 0
        tok_arr = np.full((T, S), -1, np.int64)         # −1 beyond the step's length (ARM prefixes grow)
        mask_arr = np.zeros((T, S), bool)
        key_arr = np.zeros((T, S), bool)
        edited = None if all(e is None for e in self.edited) else np.zeros((T, S), bool)
        for t in range(T):
            tok_arr[t, : self.seq_len[t]] = self.toks[t]
            mask_arr[t, : self.seq_len[t]] = self.masked[t]
            key_arr[t, : self.seq_len[t]] = self.keys[t]
            if edited is not None and self.edited[t] is not None:
                edited[t, : self.seq_len[t]] = self.edited[t]
        return {"step_numbers": self.step_numbers, "seq_len": self.seq_len, "n_real": self.n_real,
                "n_queries": self.n_q, "tokens": tok_arr, "is_masked": mask_arr, "key_mask": key_arr,
                "edited": edited}

    def to_dict(self) -> dict:
        edited = None if all(e is None for e in self.edited) else [
            0 if e is None else int(np.asarray(e).sum()) for e in self.edited]
        return {"step_numbers": list(map(int, self.step_numbers)), "n_real_keys_per_step": self.n_real.tolist(),
                "n_queries_per_step": self.n_q.tolist(), "edited_per_step": edited}

    def corpus(self, num_steps: int) -> dict:
        return {"steps": {"prompts": 1, "steps": len(self.toks), "real_keys": int(self.n_real.sum()),
                          "query_rows": int(self.n_q.sum())}}

    @classmethod
    def corpus_stream(cls, one_step_source, config) -> "StepCounts":
        return StepCounts()


class StepCounts(CorpusStream):
    """StepArrays' corpus part folded step by step: one prompt, its steps, real keys and query rows."""

    def __init__(self):
        self.steps = self.real_keys = self.query_rows = 0

    def add(self, step: Step) -> None:
        d = step.data
        self.steps += 1
        self.real_keys += int(d.key_mask.sum())
        self.query_rows += len(d.query_positions)

    def part(self) -> dict:
        return {"steps": {"prompts": 1, "steps": self.steps, "real_keys": self.real_keys,
                          "query_rows": self.query_rows}}


class TopKey(Accumulator):
    """Per (step, layer, head): the highest-scoring visible key, sink or not."""

    name = "top_key"

    def __init__(self, source, config):
        shape = (source.num_steps, source.num_layers, source.num_heads)
        self.pos, self.score = np.zeros(shape, np.int32), np.zeros(shape, np.float32)

    def add(self, step: Step) -> None:
        sc = step.scores
        self.pos[step.index], self.score[step.index] = largest_flagged(sc, np.broadcast_to(step.visible[:, None], sc.shape))

    def result(self) -> dict:
        return {"top_pos": self.pos, "top_score": self.score}

    def corpus(self, num_steps: int) -> dict:           # a sum of positions means nothing: scores only
        return {"top_key": {"score_sum": self.score.astype(np.float64).sum(axis=0)}}       # (L, H)


class Eq3Sinks(Accumulator):
    """Eq. 3 sinks: the largest per (step, layer, head), their count, and the sparse list of all."""

    name = "sinks"

    def __init__(self, source, config):
        shape = (source.num_steps, source.num_layers, source.num_heads)
        self.units = config.units
        self.largest_pos = np.full(shape, -1, np.int32)
        self.largest_score = np.full(shape, np.nan, np.float32)
        self.count = np.zeros(shape, np.int32)
        self.rows: list[tuple] = []

    def add(self, step: Step) -> None:
        t, sc, flagged, margin = step.index, step.scores, step.flagged, step.margin
        self.largest_pos[t], self.largest_score[t] = largest_flagged(sc, flagged)
        self.count[t] = flagged.sum(-1)
        l_, h_, j_ = np.nonzero(flagged)
        self.rows.append((np.full(l_.size, t, np.int32), l_.astype(np.int32), h_.astype(np.int32),
                          j_.astype(np.int32), sc[l_, h_, j_].astype(np.float32), margin[l_, h_, j_].astype(np.float32)))

    def result(self) -> dict:
        cols = list(zip(*self.rows)) if self.rows else [[]] * 6
        sinks = {name: (np.concatenate(c) if len(c) else np.zeros(0)) for name, c in
                 zip(("step", "layer", "head", "pos", "score", "margin"), cols)}
        return {"largest_pos": self.largest_pos, "largest_score": self.largest_score, "sink_count": self.count,
                "sinks": sinks}

    def to_dict(self) -> dict:
        return {"sinks_total": int(self.count.sum()),
                "fraction_heads_steps_with_sink": float((self.largest_pos >= 0).mean()),
                "largest_sink_position": {"units": "token position (−1 = no sink)",
                                          "per_step_layer_head": self.largest_pos.tolist()},
                "largest_sink_score": {"units": self.units, "per_step_layer_head": rounded(self.largest_score)}}

    def corpus(self, num_steps: int) -> dict:
        has = self.largest_pos >= 0                                                 # (T, L, H)
        return {"sinks": {"steps_with_sink": has.sum(axis=0), "sink_count": self.count.sum(axis=0),
                          "largest_score_sum": np.where(has, self.largest_score, 0.0).astype(np.float64).sum(axis=0)}}


class MeanOverHeads(Accumulator):
    """Eq. 3 on the head-averaged scores of each layer: its largest sink and sink count, (T, L)."""

    name = "mean_head"

    def __init__(self, source, config):
        self.eps = config.sink_eps
        self.pos = np.full((source.num_steps, source.num_layers), -1, np.int32)
        self.count = np.zeros((source.num_steps, source.num_layers), np.int32)

    def add(self, step: Step) -> None:
        mh = step.scores.mean(axis=1)                                   # (L, S)
        mflag = np_rule.is_sink(mh, step.visible, self.eps)
        self.count[step.index] = mflag.sum(-1)
        self.pos[step.index] = largest_flagged(mh, mflag)[0]

    def result(self) -> dict:
        return {"mean_head": {"largest_pos": self.pos, "sink_count": self.count}}

    def corpus(self, num_steps: int) -> dict:
        return {"mean_head": {"steps_with_sink": (self.pos >= 0).sum(axis=0), "sink_count": self.count.sum(axis=0)}}


class ScoreDistribution(Accumulator):
    """Fig. 3: per step, a histogram (HIST_EDGES) and QUANTILES of the visible keys' scores."""

    name = "score_distribution"
    fields = ("hist", "quantiles")
    meaning: dict = {}

    def __init__(self, source, config):
        self.units = config.units
        self.hist = np.zeros((source.num_steps, HIST_EDGES.size), np.int64)
        self.quant = np.zeros((source.num_steps, len(QUANTILES)), np.float32)

    def values(self, step: Step) -> np.ndarray:
        return step.scores[np.broadcast_to(step.visible[:, None], step.scores.shape)]

    def add(self, step: Step) -> None:
        x = self.values(step)
        self.hist[step.index] = np.bincount(np.searchsorted(HIST_EDGES, x, side="right").clip(1, HIST_EDGES.size) - 1,
                                            minlength=HIST_EDGES.size)[: HIST_EDGES.size]
        self.quant[step.index] = np.quantile(x, QUANTILES) if x.size else np.nan

    def result(self) -> dict:
        return dict(zip(self.fields, (self.hist, self.quant)))

    def to_dict(self) -> dict:
        return {self.name: {"units": self.units, **self.meaning, "bin_edges": rounded(HIST_EDGES, 6),
                            "counts_per_step": self.hist.tolist(), "quantiles": list(QUANTILES),
                            "quantiles_per_step": rounded(self.quant)}}

    def corpus(self, num_steps: int) -> dict:           # quantiles do not add over prompts; the counts do
        return {self.name: {"counts": self.hist.sum(axis=0)}}                       # (B,) over HIST_EDGES


class MarginDistribution(ScoreDistribution):
    """Fig. 3 on the Eq. 3 margins: values below the first edge (negative ones too) count in bin 0."""

    name = "margin_distribution"
    fields = ("margin_hist", "margin_quantiles")
    meaning = {"meaning": "Eq. 3 margin score_j − mean_{k≠j} score_k; margins below the first edge (negative ones "
                          "too) count in bin 0"}

    def values(self, step: Step) -> np.ndarray:
        return step.margin[np.broadcast_to(step.visible[:, None], step.margin.shape)]


class Splits(Accumulator):
    """Steps where the masked and the unmasked queries' largest sinks differ (dynamics.split_events)."""

    name = "splits"

    def __init__(self, source, config):
        self.group_names, self.eps = source.group_names, config.sink_eps
        self.num_layers, self.num_heads = source.num_layers, source.num_heads
        self.events = []

    def add(self, step: Step) -> None:
        d = step.data
        self.events += split_events(step.index, d.received_groups, self.group_names, step.visible, self.eps)

    def result(self) -> dict:
        return {"splits": self.events}

    def corpus(self, num_steps: int) -> dict:
        steps = np.zeros((self.num_layers, self.num_heads), np.int64)              # (L, H)
        for e in self.events:
            steps[e.layer, e.head] += 1
        return {"splits": {"steps": steps}}

    def to_dict(self) -> dict:
        return {"masked_unmasked_splits": {"count": len(self.events), "groups": list(self.group_names),
                                           "events": [s.to_dict() for s in self.events[:500]]}}


class SinkTokens(Accumulator):
    """Table 2: the token under every sink occurrence, counted and categorised."""

    name = "sink_tokens"

    def __init__(self, source, config):
        self.source, self.under = source, []

    def add(self, step: Step) -> None:
        self.under.append(step.data.tokens[np.nonzero(step.flagged)[2]])

    def result(self) -> dict:
        src = self.source
        under = np.concatenate(self.under) if self.under else np.zeros(0, np.int64)
        self.table = sink_token_table(under, src.decode, src.mask_id, src.special_ids)
        return {"token_table": self.table}

    def to_dict(self) -> dict:
        return {"sink_tokens": self.table.to_dict()}

    def corpus(self, num_steps: int) -> dict:
        """Occurrences per token id (with its string) and per category: they add over prompts."""
        self.result()
        return token_part(self.table)

    @classmethod
    def corpus_stream(cls, one_step_source, config) -> "SinkTokenCounts":
        return SinkTokenCounts(one_step_source)


class SinkTokenCounts(CorpusStream):
    """SinkTokens' corpus part folded step by step: occurrences per token id (the part lists the
    tokens by count over the whole prompt, so the table is built once, at the end)."""

    def __init__(self, source):
        self.source, self.counts = source, {}

    def add(self, step: Step) -> None:
        ids, n = np.unique(np.asarray(step.data.tokens[np.nonzero(step.flagged)[2]], np.int64), return_counts=True)
        for i, c in zip(ids.tolist(), n.tolist()):
            self.counts[i] = self.counts.get(i, 0) + c

    def part(self) -> dict:
        ids = np.array(sorted(self.counts), np.int64)
        counts = np.array([self.counts[i] for i in ids.tolist()], np.int64)
        src = self.source
        return token_part(counted_token_table(ids, counts, src.decode, src.mask_id, src.special_ids))


def token_part(t) -> dict:
    """A sink-token table as its corpus part."""
    return {"sink_tokens": {"token_counts": {str(r.token_id): r.count for r in t.rows},
                            "token_strings": {str(r.token_id): r.token for r in t.rows},
                            "token_categories": {str(r.token_id): r.category for r in t.rows},
                            "category_counts": {c: v["count"] for c, v in t.categories.items()}}}


class NearThreshold(Accumulator):
    """Eq. 3 cells whose verdict float16 storage could flip (`sinks.near_threshold`): per (step,
    layer, head) how many (layer, head, key) cells lie within the rounding of ε, and how many of them
    are flagged. Only for traces stored in float16 (meta received_dtype); None otherwise."""

    name = "near_threshold"

    def __init__(self, source, config):
        shape = (source.num_steps, source.num_layers, source.num_heads)
        self.applies = source.meta.get("received_dtype") == "float16"
        self.eps = config.sink_eps
        self.cells, self.sinks = np.zeros(shape, np.int32), np.zeros(shape, np.int32)

    def add(self, step: Step) -> None:
        if self.applies:
            near = near_threshold(step.scores, step.margin, self.eps)
            self.cells[step.index] = near.sum(-1)
            self.sinks[step.index] = (near & step.flagged).sum(-1)

    def result(self) -> dict:
        return {"near_threshold": self if self.applies else None}

    def corpus(self, num_steps: int) -> dict:
        if not self.applies:
            return {}
        return {"near_threshold": {"cells": self.cells.sum(axis=0).astype(np.int64),
                                   "sinks": self.sinks.sum(axis=0).astype(np.int64)}}

    def to_dict(self) -> dict:
        if not self.applies:
            return {"near_threshold": None}
        return {"near_threshold": {
            "units": "(step, layer, head, key) cells whose Eq. 3 margin is within float16 rounding of ε "
                     "(2^-11 of the scores it is made of): the verdict could differ with float32 storage",
            "cells": int(self.cells.sum()), "sinks": int(self.sinks.sum()),
            "per_step": self.cells.sum(axis=(1, 2)).tolist()}}
