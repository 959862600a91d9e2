"""`sinklens report TRACE [TRACE ...] --out DIR`: figures, summary and the interactive page from traces.

`sinklens report CORPUS.jsonl --out DIR`: the same for a corpus run's totals (sinklens/report/corpus.py).

`--control` draws the random-init control of the same shape beside the readouts: a trace for a
trace report, a corpus file for a corpus report (`sinklens trace ... --random-init SEED` makes either).

The option flags are the `param` fields of `ReportOptions` and `PageOptions` (`--html-*`;
sinklens/report/options.py), built by `sinklens/cli/fields.py`: a new option is a new field there.
"""
from __future__ import annotations

import argparse
import os
import time

from sinklens.cli.fields import add_config_flags, flag_values
from sinklens.cli.types import out_folder

PAGE_PREFIX = "html_"   # PageOptions.max_mb -> --html-max-mb


def options(args: argparse.Namespace):
    """ReportOptions from the parsed flags; `progress` comes from --quiet."""
    from sinklens.report.options import PageOptions, ReportOptions

    from sinklens.cli.logs import verbose

    page = PageOptions(**flag_values(PageOptions, args, PAGE_PREFIX))
    return ReportOptions(**flag_values(ReportOptions, args), page=page, progress=args.progress, log=verbose)


WANTED = "expected a trace .arrow of `sinklens trace`, or the corpus.jsonl of `sinklens trace --prompts`"


def check_inputs(paths: list[str]) -> list[str]:
    """The files `report` reads (a corpus run's folder: its corpus.jsonl; a folder of traces: its
    .arrow files), each input named in one line when it cannot be read, before any work."""
    from sinklens.cli.types import CliError
    from sinklens.report.folder import expand_inputs

    for p in paths:
        if not os.path.exists(p):
            raise CliError(f"{p!r}: no such file; {WANTED}")
    return expand_inputs(paths)


def run(args: argparse.Namespace) -> int:
    from sinklens.analysis.corpus import is_corpus_file

    args.traces = check_inputs(args.traces)
    corpora = [p for p in args.traces if is_corpus_file(p)]
    if args.control is not None and not os.path.isfile(args.control):
        from sinklens.cli.types import CliError
        raise CliError(f"--control {args.control!r}: no such file (expected the random-init control's trace or corpus.jsonl)")
    if corpora:
        return run_corpus(args, corpora)
    if args.control is not None and is_corpus_file(args.control):
        from sinklens.cli.types import CliError
        raise CliError(f"--control {args.control} is a corpus file, but the report is on traces; give the control's "
                       "trace (the same prompt and flags with --random-init SEED), or report a corpus against it")
    from sinklens.report.report import build_report

    since = time.time()
    with out_folder(args.out):
        rep = build_report(args.traces, args.out, labels=args.labels, options=options(args))
    if args.json:
        from sinklens.cli.logs import print_json

        print_json({"out": rep.out, "html": rep.html, "summary_md": rep.summary_md, "summary_json": rep.summary_json,
                    "compare_figures": rep.figures, "notes": rep.notes, "traces": [_headline(r) for r in rep.traces]})
        return 0
    n_fig = sum(len(r.figures) for r in rep.traces) + len(rep.figures)
    print(f"wrote {n_fig} figures/tables, {rep.summary_md}, {rep.summary_json} and {rep.html} "
          f"({rep.html.stat().st_size / 1e6:.1f} MB)")
    for note in rep.notes:
        print(f"  note: {note}")
    size_mb, cap = rep.html.stat().st_size / 1e6, args.html_max_mb
    if cap and size_mb > cap:   # the cap thins per-head data only; said, not left for the reader to find
        print(f"  note: index.html is {size_mb:.1f} MB, over --html-max-mb {cap:g}: per-head data is kept for as "
              "few steps as it can be, the figures and the mean over heads are always kept")
    for r in rep.traces:
        a = r.analyses[0]
        if a.source.truncated:  # said here too: a report of part of a run must not pass for the whole run
            print(f"  {r.label}: the trace is truncated (its run was interrupted): only its {a.num_steps} "
                  "finished steps are analysed")
        for name, why in r.skipped.items():
            print(f"  {r.label}: {name} not drawn: {why}")
    say_earlier_files(args.out, since)
    return 0


def say_earlier_files(out: str, since: float) -> None:
    """A note when --out still holds an earlier report's figures that this one did not replace."""
    from sinklens.report.folder import earlier_files

    old = earlier_files(out, since)
    if old:
        names = ", ".join(str(p.relative_to(out)) for p in old[:3]) + (", ..." if len(old) > 3 else "")
        print(f"  note: {out} also holds {len(old)} figure/table files of an earlier report ({names}), not part of "
              "this one (index.html and summary.* are); give a new --out for a folder with this report alone")


def run_corpus(args: argparse.Namespace, corpora: list[str]) -> int:
    """A corpus file (`sinklens trace --prompts`): its totals' report (sinklens/report/corpus.py)."""
    from sinklens.cli.types import CliError
    from sinklens.report.corpus import build_corpus_report

    if len(args.traces) > 1:
        raise CliError(f"a corpus file is reported on its own: got {len(args.traces)} files, of which "
                       f"{len(corpora)} corpus file(s) ({corpora[0]}); run one report per corpus")
    from sinklens.analysis.corpus import is_corpus_file, open_corpus

    views = open_corpus(corpora[0]).totals
    if args.units not in views:
        raise CliError(f"--units {args.units}: {corpora[0]} was traced in units {', '.join(views)} (a corpus keeps "
                       "totals, which cannot be re-scored); report one of its kept traces in other units")
    if args.control is not None and not is_corpus_file(args.control):
        raise CliError(f"--control {args.control} is not a corpus file, but the report is on a corpus; give the "
                       "control's corpus.jsonl (the same prompts and flags with --random-init SEED)")
    since = time.time()
    with out_folder(args.out):
        rep = build_corpus_report(corpora[0], args.out, figures=args.figures, control=args.control)
    if args.json:
        from sinklens.cli.logs import print_json

        views = rep.corpus.to_dict()["views"]
        print_json({"out": str(rep.out), "html": str(rep.html), "summary_md": str(rep.summary_md),
                    "summary_json": str(rep.summary_json), "corpus": corpora[0], "control": args.control,
                    "prompts": rep.corpus.num_prompts,
                    "figures": {k: [str(p) for p in v] for k, v in rep.figures.items()},
                    "views": {u: {k: v[k] for k in ("units", "prompts", "steps", "sinks_total",
                                                    "fraction_heads_steps_with_sink")} for u, v in views.items()}})
        return 0
    print(f"wrote {len(rep.figures)} figures/tables, {rep.summary_md}, {rep.summary_json} and {rep.html} "
          f"({rep.corpus.num_prompts} prompts)")
    say_earlier_files(args.out, since)
    return 0


def _headline(r) -> dict:
    """A trace's headline numbers (every number: summary.json)."""
    d = r.analyses[0].to_dict()
    keys = ("units", "sink_eps", "shape", "sinks_total", "fraction_heads_steps_with_sink", "track_kinds")
    return {"label": r.label, "folder": r.folder, "truncated": r.analyses[0].source.truncated,
            **{k: d.get(k) for k in keys}, "figures": r.figures,
            "figures_skipped": r.skipped}


def register(sub) -> None:
    from sinklens.report.options import PageOptions, ReportOptions

    p = sub.add_parser("report", help="figures, summary and an interactive HTML page from one or more traces",
                       description="Analyse saved traces (no model needed): sinks (paper Eq. 3), dynamics, the "
                                   "paper's figures, summary.md/json and one self-contained HTML page. Several "
                                   "traces are compared side by side.")
    p.add_argument("traces", nargs="+", help="trace files (.arrow) written by the samplers or a folder of them, or "
                   "one corpus file (corpus.jsonl of `sinklens trace --prompts`) or the run folder holding it")
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--labels", type=lambda s: s.split(","), default=None,
                   help="comma-separated display names for the traces (default: file names); each trace's "
                        "sub-folder is a safe name made from it, never a path")
    p.add_argument("--json", action="store_true", help="print one JSON line instead of the text: the page, the "
                   "summaries, the figures and each trace's headline numbers (sinks, tracks)")
    add_config_flags(p, ReportOptions)
    add_config_flags(p, PageOptions, PAGE_PREFIX)
    p.set_defaults(func=run)
