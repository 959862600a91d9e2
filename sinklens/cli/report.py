"""`sinklens report TRACE [TRACE ...] --out DIR`: figures, summary and the interactive page from traces.

The option flags are the `param` fields of `ReportOptions` and `PageOptions` (`--html-*`;
sinklens/report/options.py), built by `sinklens/cli/fields.py`: a new option is a new field there.
"""
from __future__ import annotations

import argparse

from sinklens.cli.fields import add_config_flags, flag_values

PAGE_PREFIX = "html_"   # PageOptions.max_mb -> --html-max-mb


def options(args: argparse.Namespace):
    """ReportOptions from the parsed flags; `progress` comes from --quiet."""
    from sinklens.report.options import PageOptions, ReportOptions

    page = PageOptions(**flag_values(PageOptions, args, PAGE_PREFIX))
    return ReportOptions(**flag_values(ReportOptions, args), page=page, progress=args.progress)


def run(args: argparse.Namespace) -> int:
    from sinklens.report.report import build_report

    rep = build_report(args.traces, args.out, labels=args.labels, options=options(args))
    n_fig = sum(len(r.figures) for r in rep.traces) + len(rep.figures)
    print(f"wrote {n_fig} figures/tables, {rep.summary_md}, {rep.summary_json} and {rep.html} "
          f"({rep.html.stat().st_size / 1e6:.1f} MB)")
    for r in rep.traces:
        for name, why in r.skipped.items():
            print(f"  {r.label}: {name} not drawn: {why}")
    return 0


def register(sub) -> None:
    from sinklens.report.options import PageOptions, ReportOptions

    p = sub.add_parser("report", help="figures, summary and an interactive HTML page from one or more traces",
                       description="Analyse saved traces (no model needed): sinks (paper Eq. 3), dynamics, the "
                                   "paper's figures, summary.md/json and one self-contained HTML page. Several "
                                   "traces are compared side by side.")
    p.add_argument("traces", nargs="+", help="trace files (.arrow) written by the samplers")
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--labels", type=lambda s: s.split(","), default=None,
                   help="comma-separated names for the traces (default: file names)")
    add_config_flags(p, ReportOptions)
    add_config_flags(p, PageOptions, PAGE_PREFIX)
    p.set_defaults(func=run)
