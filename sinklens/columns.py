"""Declared per-row arrays: the `Column` type every trace column is declared with, and each
mechanism readout declared once (its option and its trace columns).

Below both the attention function and the trace (standard library only), so the two derive from
one declaration: `sinklens.trace.readouts.ReadoutOptions` (the capture options and the
`sinklens trace` flags) and `AttentionRequest`'s readout instructions are built from `READOUTS`,
and the trace's readout columns are their `columns`. A new readout is one entry here plus the
code that computes it (sinklens/attention/readouts.py).

Shapes are per batch row, in letters: S positions (keys), L layers, H heads, G query groups,
Q query rows, K top-k entries, P lens positions, N lens layers, k top tokens, 3 a (layer, head,
position) triple; "" (a scalar per row). Letters other than S / L / H / G are free (their
length is whatever the step records). Stored row-major and flat, one cell per (step, row).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any


@dataclass(frozen=True)
class Column:
    """One trace column: name, per-row shape in letters (module docstring), value type, meaning,
    and the value a step that gives none stores: None = a null cell, else a fill (a canvas flag)."""

    name: str
    shape: str       # e.g. "S", "LHS" (L, H, S), "GLHS", "LH", "LQK"
    dtype: str       # "int32", "bool", "float32", or "received" (the trace's received dtype)
    meaning: str
    fill: Any = None  # what an absent (S,)-shaped cell holds (False / True); None: null

    @cached_property  # read at every step of a trace
    def layer_axis(self) -> int | None:
        """Where the layer axis goes when a capture is held layer first ([T,] L, B, ...): its place in
        the batch-first cell (1 for "LHS", 2 for "GLHS"); None when the column has no layer axis."""
        return self.shape.index("L") + 1 if "L" in self.shape else None


@dataclass(frozen=True)
class Readout:
    """One mechanism readout: its option (off by default) and its trace columns."""

    name: str        # the option: a CaptureOptions field, a --flag, an AttentionRequest instruction
    kind: str        # "bool" (on / off) or "indices" (a list of ints; None = off)
    help: str
    columns: tuple[Column, ...]

    @property
    def off(self):
        """The option's default (off): False, or None for indices."""
        return False if self.kind == "bool" else None


READOUTS: tuple[Readout, ...] = (
    Readout("value_norms", "bool", "readout: L2 norm of each key's value vector per (layer, head, key)",
            (Column("value_norm", "LHS", "received", "||v_j||_2 of key j's value vector (head h's kv head)"),)),
    Readout("qk_norms", "bool", "readout: ||k_j|| and the mean cos(q_i, k_j) over the summed query rows per "
                                "(layer, head, key), and the mean ||q_i|| per (layer, head)",
            (Column("key_norm", "LHS", "received", "||k_j||_2 after RoPE"),
             Column("qk_cos", "LHS", "received", "mean over summed query rows i of cos(q_i, k_j)"),
             Column("query_norm", "LH", "float32", "mean over summed query rows of ||q_i||_2 after RoPE"))),
    Readout("diagonal", "bool", "readout: diagonal share sum_i A[i, i] / Q per (layer, head) (self attention)",
            (Column("diagonal", "LH", "float32", "sum over summed query rows i of A[i, i], / Q"),)),
    Readout("distance", "bool", "readout: received attention by query-key distance |i - j| per "
                                "(layer, head, distance)",
            (Column("distance", "LHS", "received", "sum of A[i, j] over summed rows i and keys |i - j| = d"),)),
    Readout("hidden_norms", "bool", "readout: residual-stream norm per (layer, position) and its "
                                    "largest channels (massive activations)",
            (Column("hidden_norm", "LQ", "float32", "||h_l,i||_2 of layer l's output at position i"),
             Column("hidden_top_channels", "LQK", "int32", "the largest |h_c| channels, largest first"),
             Column("hidden_top_values", "LQK", "float32", "their signed values"),
             Column("hidden_median_abs", "L", "float32", "median |h_c| over every (position, channel) of "
                                                       "layer l's output (Sun et al. 2024's denominator)"))),
    Readout("lens_layers", "indices", "readout: logit lens at these layers (0-based; the layer's output through the "
                                      "final norm and LM head, its top tokens), at the positions --lens-positions "
                                      "names, else each step's Eq. 3 sink positions",
            (Column("lens_positions", "P", "int32", "positions the logit lens read at this step"),
             Column("lens_tokens", "NPk", "int32", "top tokens per (lens layer, position), N = lens layers"),
             Column("lens_probs", "NPk", "float32", "their probabilities under the lens' softmax"))),
    Readout("lens_positions", "indices", "positions the logit lens reads (default: each step's Eq. 3 sink "
                                         "positions, the keys flagged in the most heads)", ()),
)
READOUT_NAMES = tuple(r.name for r in READOUTS)
