"""The learned sink: how much attention a model's sink logits took (gpt-oss), per step, layer and head.

A learned sink logit joins each head's softmax as a key with no value and no position, so what
it takes is attention no real key receives: received.sum(-1) + learned_sink = the number of
summed query rows. Its *share* divides by that number: 0..1, the fraction of the summed rows'
attention that went nowhere. It is not a key, so the sink rule (Eq. 3) never sees it; this is
the column beside the keys that says how big the model's built-in sink is next to them.
"""
from __future__ import annotations

import numpy as np

from sinklens.analysis.accumulate import Accumulator, Step, rounded

UNITS_MEANING = ("share of the summed query rows' attention taken by the learned sink logits (0..1): "
                 "learned_sink / number of query rows; received.sum(-1) + learned_sink = number of query rows")


class LearnedSink(Accumulator):
    """(T, L, H) learned-sink share per step, NaN at steps whose trace row has none."""

    name = "learned_sink"

    def __init__(self, source, config):
        self.share = np.full((source.num_steps, source.num_layers, source.num_heads), np.nan, np.float32)
        self.seen = False

    def add(self, step: Step) -> None:
        d = step.data
        if d.learned_sink is None:
            return
        rows = len(d.query_positions)
        if rows:
            self.share[step.index] = np.asarray(d.learned_sink, np.float32) / rows
        self.seen = True

    def result(self) -> dict:
        return {"learned_sink_share": self.share if self.seen else None}

    def to_dict(self) -> dict:
        if not self.seen:
            return {"learned_sink": None}
        s = self.share
        with np.errstate(all="ignore"):   # steps without the column are NaN: left out of the means
            layer_head = np.nanmean(s, axis=0)                                    # (L, H)
            per_step = np.nanmean(s.reshape(s.shape[0], -1), axis=1)             # (T,)
        return {"learned_sink": {"units": UNITS_MEANING, "mean": float(np.nanmean(s)), "max": float(np.nanmax(s)),
                                 "per_layer_mean": rounded(np.nanmean(layer_head, axis=1)),
                                 "layer_head_mean": rounded(layer_head), "per_step_mean": rounded(per_step)}}


def learned_sink_line(d: dict) -> str:
    """One line for the summaries (the page's table, summary.md) from to_dict()['learned_sink']."""
    layers = ", ".join(f"layer {l} {100 * v:.3g} %" for l, v in enumerate(d["per_layer_mean"]) if v is not None)
    return (f"the sink logits took {100 * d['mean']:.3g} % of the summed query rows' attention on average "
            f"(at most {100 * d['max']:.3g} % in one step and head); per layer: {layers}")
