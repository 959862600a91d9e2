"""sinklens: where attention goes inside diffusion language models while they denoise.

Public API (thin layer over the modules; see docs/design.md):
    sinklens.load(name_or_path, ...)   -> SinkModel
    sinklens.open_trace(path)          -> Trace
    sinklens.analyze(trace, ...)       -> Analysis  (sinks, dynamics, Table 2; docs/analysis.md)
    sinklens.show(trace_or_report)     the interactive page inline in a notebook (docs/interop.md)
    sinklens.export                    bertviz / circuitsvis inputs from a trace's stored maps
"""
from sinklens._version import __version__  # noqa: F401  (one source: pyproject reads it too)


def open_trace(path):
    """Open a trace file lazily (see sinklens.trace.reader.open_trace)."""
    from sinklens.trace.reader import open_trace as _open_trace

    return _open_trace(path)


def load(name_or_path, *, revision=None, dtype=None, device=None, random_init=None, mode=None):
    """Load a checkpoint (alias, local folder, .gguf or hub id) as a SinkModel (sinklens.models.loader.load);
    random_init=SEED: its random-init control (same shape, every weight re-initialised); mode: the mode of a
    checkpoint trained in two (tiny-dual: block diffusion by default, mode="ar" the same weights as an ARM)."""
    from sinklens.models.loader import load as _load

    return _load(name_or_path, revision=revision, dtype=dtype, device=device, random_init=random_init, mode=mode)


def analyze(trace, **options):
    """Sinks (paper Eq. 3), dynamics and sink tokens of a trace path / Trace (sinklens.analysis.analyze)."""
    from sinklens.analysis.analyze import analyze as _analyze

    return _analyze(trace, **options)


def show(x, **options):
    """The interactive page inline in a notebook, for a trace, Analysis or Report (sinklens.report.show)."""
    from sinklens.report.show import show as _show

    return _show(x, **options)
