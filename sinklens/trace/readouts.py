"""Mechanism readouts: what a capture may record beside received attention, in the same forward.

Each readout is one option (off by default; a `CaptureOptions` field and a `sinklens trace` flag,
both derived from `ReadoutOptions`) and one or more optional trace columns declared in `COLUMNS`
(the writer, the reader and the analysis read their shapes from here). All are O(L·H·S) or less
per step and batch row. docs/analysis.md ("Mechanism readouts") gives each one's source paper.

No imports beyond the standard library: the command line reads these fields for --help.
"""
from __future__ import annotations

from dataclasses import dataclass, fields

from sinklens.params import check_fields, param


@dataclass(kw_only=True)   # keyword-only: CaptureOptions inherits them and keeps its own positional order
class ReadoutOptions:
    """Optional readouts of the capture pass (docs/analysis.md, "Mechanism readouts")."""

    value_norms: bool = param(False, bool, "readout: L2 norm of each key's value vector per (layer, head, key)")
    qk_norms: bool = param(False, bool, "readout: ||k_j|| and the mean cos(q_i, k_j) over the summed query rows per "
                                        "(layer, head, key), and the mean ||q_i|| per (layer, head)")
    diagonal: bool = param(False, bool, "readout: diagonal share sum_i A[i, i] / Q per (layer, head) (self attention)")
    distance: bool = param(False, bool, "readout: received attention by query-key distance |i - j| per "
                                        "(layer, head, distance)")
    hidden_norms: bool = param(False, bool, "readout: residual-stream norm per (layer, position) and its "
                                            "largest channels (massive activations)")
    lens_layers: list | None = param(None, "indices", "readout: logit lens at these layers (0-based; the layer's "
                                     "output through the final norm and LM head, its top tokens), at the "
                                     "positions --lens-positions names, else each step's Eq. 3 sink positions")
    lens_positions: list | None = param(None, "indices", "positions the logit lens reads (default: each step's "
                                        "Eq. 3 sink positions, the keys flagged in the most heads)")

    def __post_init__(self):
        check_fields(self)
        if self.lens_positions is not None and self.lens_layers is None:
            raise ValueError("lens_positions needs lens_layers: name the layers the logit lens reads")

    @property
    def any(self) -> bool:
        return any(bool(getattr(self, name)) for name in READOUT_FIELDS)

    def readouts(self) -> dict:
        """The readout fields alone (what the trace metadata records under `readouts`)."""
        return {name: getattr(self, name) for name in READOUT_FIELDS}


READOUT_FIELDS = tuple(f.name for f in fields(ReadoutOptions))  # read at every step: not dataclasses.fields() each time


@dataclass(frozen=True)
class Column:
    """One optional trace column: its name, its per-row shape in words, its value type."""

    name: str
    shape: str       # row-major, per batch row: "LHS" (L, H, S), "LH" (L, H), "LS" (L, S), "LSK" (L, S, k), ...
    dtype: str       # "received" (the trace's received dtype), "float32" or "int32"
    meaning: str


COLUMNS: dict[str, tuple[Column, ...]] = {
    "value_norms": (Column("value_norm", "LHS", "received", "||v_j||_2 of key j's value vector (head h's kv head)"),),
    "qk_norms": (Column("key_norm", "LHS", "received", "||k_j||_2 after RoPE"),
                 Column("qk_cos", "LHS", "received", "mean over summed query rows i of cos(q_i, k_j)"),
                 Column("query_norm", "LH", "float32", "mean over summed query rows of ||q_i||_2 after RoPE")),
    "diagonal": (Column("diagonal", "LH", "float32", "sum over summed query rows i of A[i, i], / Q"),),
    "distance": (Column("distance", "LHS", "received", "sum of A[i, j] over summed rows i and keys |i - j| = d"),),
    "hidden_norms": (Column("hidden_norm", "LS", "float32", "||h_l,i||_2 of layer l's output at position i"),
                     Column("hidden_top_channels", "LSK", "int32", "the largest |h_c| channels, largest first"),
                     Column("hidden_top_values", "LSK", "float32", "their signed values"),
                     Column("hidden_median_abs", "L", "float32", "median |h_c| over every (position, channel) of "
                                                               "layer l's output (Sun et al. 2024's denominator)")),
    "lens_layers": (Column("lens_positions", "P", "int32", "positions the logit lens read at this step"),
                    Column("lens_tokens", "NPk", "int32", "top tokens per (lens layer, position), N = lens layers"),
                    Column("lens_probs", "NPk", "float32", "their probabilities under the lens' softmax")),
}
COLUMN_NAMES = tuple(c.name for cols in COLUMNS.values() for c in cols)
