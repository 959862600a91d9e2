"""`sinklens report TRACE [TRACE ...] --out DIR`: figures, summary and the interactive page from traces."""
from __future__ import annotations

import argparse

from sinklens.cli.types import nonneg_float, nonneg_int, positive_float


def _heads(text: str) -> list[tuple[int, int]]:
    """'3:5,31:0' -> [(3, 5), (31, 0)]"""
    out = []
    for part in text.split(","):
        try:
            l, h = part.split(":")
            out.append((int(l), int(h)))
        except ValueError:
            raise argparse.ArgumentTypeError(f"--heads expects LAYER:HEAD pairs separated by commas, got {part!r}") from None
        if min(out[-1]) < 0:
            raise argparse.ArgumentTypeError(f"--heads: layer and head must be >= 0, got {part!r}")
    return out


def _ints(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if min(values) < 0:                     # step / layer indices
        raise argparse.ArgumentTypeError(f"expected comma-separated integers >= 0, got {text!r}")
    return values


def run(args: argparse.Namespace) -> int:
    from sinklens.report.html import PageOptions
    from sinklens.report.report import ReportOptions, build_report

    page = PageOptions(max_mb=None if args.html_max_mb <= 0 else args.html_max_mb, layers=args.html_layers,
                       title=args.title)
    opts = ReportOptions(units=args.units, eps=args.eps, heads=args.heads, map_steps=args.map_steps, page=page,
                         progress=args.progress, row=args.row, figures=not args.no_figures)
    rep = build_report(args.traces, args.out, labels=args.labels, options=opts)
    n_fig = sum(len(r.figures) for r in rep.traces) + len(rep.figures)
    print(f"wrote {n_fig} figures/tables, {rep.summary_md}, {rep.summary_json} and {rep.html} "
          f"({rep.html.stat().st_size / 1e6:.1f} MB)")
    for r in rep.traces:
        for name, why in r.skipped.items():
            print(f"  {r.label}: {name} not drawn: {why}")
    return 0


def register(sub) -> None:
    p = sub.add_parser("report", help="figures, summary and an interactive HTML page from one or more traces",
                       description="Analyse saved traces (no model needed): sinks (paper Eq. 3), dynamics, the "
                                   "paper's figures, summary.md/json and one self-contained HTML page. Several "
                                   "traces are compared side by side.")
    p.add_argument("traces", nargs="+", help="trace files (.arrow) written by the samplers")
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--labels", type=lambda s: s.split(","), default=None,
                   help="comma-separated names for the traces (default: file names)")
    p.add_argument("--units", default="sum", choices=["sum", "mean", "gu", "uniform_ratio"],
                   help="score units (default sum = column sums, where the paper's eps = 3 applies)")
    p.add_argument("--eps", type=positive_float, default=3.0, help="Eq. 3 threshold in --units (default 3)")
    p.add_argument("--heads", type=_heads, default=None, help="Fig. 7 heads as LAYER:HEAD,... (default: most dynamic)")
    p.add_argument("--map-steps", type=_ints, default=None, help="Fig. 4 step indices (default: up to 3 stored)")
    p.add_argument("--html-max-mb", type=nonneg_float, default=150.0,
                   help="cap on the HTML page size; per-head data is then kept every k-th step (0 = no cap)")
    p.add_argument("--html-layers", type=_ints, default=None, help="keep per-head data in the page for these layers only")
    p.add_argument("--row", type=nonneg_int, default=0, help="batch row to analyse in every trace (default 0)")
    p.add_argument("--no-figures", action="store_true", help="only summary.md/json and the page (faster)")
    p.add_argument("--title", default="sinklens report", help="title of the HTML page")
    p.set_defaults(func=run)
