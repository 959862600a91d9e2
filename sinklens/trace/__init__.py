"""The trace file: one Arrow IPC stream per run (docs/design.md, Contract 4; docs/samplers.md)."""
from sinklens.trace.layout import TraceLayout
from sinklens.trace.reader import Trace, open_trace
from sinklens.trace.schema import SCHEMA_VERSION, TraceFormatError
from sinklens.trace.writer import TraceWriter

__all__ = ["Trace", "TraceWriter", "TraceFormatError", "SCHEMA_VERSION", "open_trace"]
