"""Mechanism readouts: what a capture may record beside received attention, in the same forward.

Each readout is declared once in `sinklens.columns.READOUTS` (its option and its trace columns);
here they become `ReadoutOptions` (the `CaptureOptions` fields and the `sinklens trace` flags) and
`COLUMNS` (the optional trace columns the writer, the reader and the analysis read their shapes
from). All are O(L·H·S) or less per step and batch row. docs/analysis.md ("Mechanism readouts")
gives each one's source paper.

No imports beyond the standard library: the command line reads these fields for --help.
"""
from __future__ import annotations

from dataclasses import make_dataclass

from sinklens.columns import READOUT_NAMES, READOUTS, Column
from sinklens.params import check_fields, param

READOUT_FIELDS = READOUT_NAMES  # read at every step: not dataclasses.fields() each time


def _post_init(self):
    check_fields(self)
    if self.lens_positions is not None and self.lens_layers is None:
        raise ValueError("lens_positions needs lens_layers: name the layers the logit lens reads")


def _any(self) -> bool:
    return any(bool(getattr(self, name)) for name in READOUT_FIELDS)


def _readouts(self) -> dict:
    """The readout fields alone (what the trace metadata records under `readouts`)."""
    return {name: getattr(self, name) for name in READOUT_FIELDS}


# keyword-only: CaptureOptions inherits them and keeps its own positional order
ReadoutOptions = make_dataclass(
    "ReadoutOptions",
    [(r.name, bool if r.kind == "bool" else (list | None), param(r.off, bool if r.kind == "bool" else r.kind, r.help))
     for r in READOUTS],
    namespace={"__post_init__": _post_init, "any": property(_any), "readouts": _readouts,
               "__doc__": "Optional readouts of the capture pass (docs/analysis.md, \"Mechanism readouts\")."},
    kw_only=True)
ReadoutOptions.__module__ = __name__

COLUMNS: dict[str, tuple[Column, ...]] = {r.name: r.columns for r in READOUTS if r.columns}
COLUMN_NAMES = tuple(c.name for cols in COLUMNS.values() for c in cols)
