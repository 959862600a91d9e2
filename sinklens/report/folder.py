"""The report's output folder: what a report may replace there.

A report writes index.html, summary.json and summary.md under fixed names, the names a user's own
page or notes in that folder may well have. A report re-run into its own folder replaces them (that
folder's summary.json says a report wrote it); anywhere else such a file is refused before any
work, so `--out .` or `--out my-project/` never overwrites what sinklens did not write.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

from sinklens.analysis.source import AnalysisInputError

FIXED_NAMES = ("index.html", "summary.json", "summary.md")   # written by every report, trace or corpus


def _is_report_summary(path: Path) -> bool:
    """summary.json written by a sinklens report: a trace report's ("sinklens_report") or a corpus report's."""
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except (OSError, UnicodeDecodeError, ValueError):
        return False
    return isinstance(doc, dict) and ("sinklens_report" in doc or {"corpus", "num_prompts", "num_heads"} <= doc.keys())


def check_out_folder(out: str | Path) -> None:
    """Refuse `out` when it holds a file of the report's fixed names that no earlier report wrote."""
    out = Path(out)
    if not out.is_dir() or _is_report_summary(out / "summary.json"):
        return
    theirs = [n for n in FIXED_NAMES if (out / n).exists()]
    if theirs:
        raise AnalysisInputError(f"--out {str(out)!r} holds {', '.join(theirs)} that no sinklens report wrote; a "
                                 f"report would overwrite {'them' if len(theirs) > 1 else 'it'}: give a new folder "
                                 "or an earlier report's")


# the names a report gives its figures and tables (fig05_layer_head.png, readout_massive.svg, table2_...md)
REPORT_FILE = re.compile(r"(fig\d+|readout|table\d+|compare_fig\d+)_\w+\.(png|svg|md|csv)")


def earlier_files(out: str | Path, since: float) -> list[Path]:
    """Figures and tables in `out` (and its trace subfolders) of the names a report writes, last
    written before `since`: an earlier report's, which this one did not replace (another trace,
    another model, other readouts). Never deleted: they are said, so nobody reads them as this
    report's."""
    out = Path(out)
    if not out.is_dir():
        return []
    found = []
    for p in sorted(out.rglob("*")):
        if p.is_symlink() or not p.is_file() or not REPORT_FILE.fullmatch(p.name):
            continue
        if p.stat().st_mtime < since:
            found.append(p)
    return found


def expand_inputs(paths: list[str]) -> list[str]:
    """What `sinklens report` reads from each path it is given: a file as it is; a folder a corpus run
    wrote (`trace --prompts ... --out DIR`) as its DIR/corpus.jsonl; a folder of traces as its
    .arrow files in name order. Anything else: one line why not."""
    out = []
    for p in paths:
        d = Path(p)
        if not d.is_dir():
            out.append(p)
            continue
        if (d / "corpus.jsonl").is_file():
            out.append(str(d / "corpus.jsonl"))
            continue
        traces = sorted(str(f) for f in d.glob("*.arrow") if f.is_file())
        if not traces:
            raise AnalysisInputError(f"{p!r} is a folder with neither a corpus.jsonl (a `sinklens trace --prompts` run) "
                                     "nor .arrow traces; give a trace, a corpus file or such a folder")
        out += traces
    return out
