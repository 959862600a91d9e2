"""`sinklens.show(x)`: the interactive page inline in a notebook.

    sinklens.show("run.arrow")                 # a trace path, Trace or Source: analysed here
    sinklens.show(a)                           # an Analysis (or a list of them: one column each)
    sinklens.show(report)                      # what build_report returned, figures included

Each call gets its own element-id prefix, so two pages in one notebook (or one document) work
independently. The page is the same as `index.html` of `sinklens report` (docs/analysis.md); its
data is inlined, so a large trace makes a large cell output (`max_mb`, as in PageOptions).
Outside IPython, `show` returns the `PageView` (its `.html` is the fragment) instead of displaying.
"""
from __future__ import annotations

import io
import uuid
from dataclasses import dataclass
from pathlib import Path

from sinklens.analysis.analyze import Analysis, AnalysisConfig, analyze
from sinklens.analysis.source import as_source
from sinklens.report.html import HERE, PageOptions, write_fragment
from sinklens.rule.spec import BASELINE_UNITS, DEFAULT_EPS, DEFAULT_UNITS


@dataclass
class PageView:
    html: str           # an HTML fragment: <style>, the viewers, their data and script

    def _repr_html_(self) -> str:
        return self.html

    def __repr__(self) -> str:
        return f"PageView({len(self.html) / 1e3:.0f} kB of HTML; display it in a notebook or write .html to a file)"


def _views(x, units: str, sink_eps: float) -> list[Analysis]:
    """An Analysis, or a trace analysed in `units` (causal traces: uniform_ratio as the second view)."""
    if isinstance(x, Analysis):
        return [x]
    src = as_source(x)
    views = [analyze(src, AnalysisConfig(units=units, sink_eps=sink_eps))]
    if src.causal and units != BASELINE_UNITS:
        views.append(analyze(src, AnalysisConfig(units=BASELINE_UNITS, sink_eps=sink_eps)))
    return views


def page_view(x, *, units: str = DEFAULT_UNITS, sink_eps: float = DEFAULT_EPS, title: str = "sinklens", max_mb: float | None = 50.0,
              figures: bool = True) -> PageView:
    """The page fragment for a Report, an Analysis, a trace (path / Trace / Source) or a list of them."""
    from sinklens.report.report import Report

    groups, figs = [], []
    if isinstance(x, Report):
        for r in x.traces:
            groups.append(r.analyses)
            figs.append({name: Path(p).read_bytes() for name, paths in r.figures.items()
                         for p in paths if figures and Path(p).suffix == ".png"})
    else:
        for item in (x if isinstance(x, (list, tuple)) else [x]):
            groups.append(_views(item, units, sink_eps))
            figs.append({})
    opts = PageOptions(max_mb=max_mb, title=title, element_prefix="sl" + uuid.uuid4().hex[:10])
    buf = io.StringIO()
    write_fragment(buf, groups, opts, figs, css=(HERE / "viewer.css").read_text(encoding="utf-8"))
    return PageView(buf.getvalue())


def show(x, **options) -> PageView | None:
    """Display the interactive page inline (IPython / Jupyter); elsewhere return the PageView.
    Options: units, sink_eps, title, max_mb, figures (see `page_view`)."""
    view = page_view(x, **options)
    try:
        from IPython import get_ipython
    except ImportError:
        return view
    if get_ipython() is None:
        return view
    from IPython.display import HTML, display

    display(HTML(view.html))
    return None
