"""sinklens: where attention goes inside diffusion language models while they denoise.

Public API (thin layer over the modules; see docs/design.md):
    sinklens.load(name_or_path, ...)   -> SinkModel
    sinklens.open_trace(path)          -> Trace
"""
__version__ = "0.1.0"
