"""The trace file: one Arrow IPC stream per run (docs/design.md, Contract 4; docs/samplers.md).

The names below are imported from their module on first use: `sinklens.trace.layout` (which every
sampler module reads, and the command line imports for --help) must not import pyarrow.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sinklens.trace.layout import TraceLayout
    from sinklens.trace.reader import Trace, open_trace
    from sinklens.trace.schema import SCHEMA_VERSION, TraceFormatError
    from sinklens.trace.writer import TraceWriter

_HOME = {"TraceLayout": "layout", "Trace": "reader", "open_trace": "reader", "SCHEMA_VERSION": "schema",
         "TraceFormatError": "schema", "TraceWriter": "writer"}


def __getattr__(name: str):
    if name in _HOME:
        return getattr(importlib.import_module(f"{__name__}.{_HOME[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["Trace", "TraceLayout", "TraceWriter", "TraceFormatError", "SCHEMA_VERSION", "open_trace"]
