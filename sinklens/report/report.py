"""`sinklens report TRACE [TRACE ...] --out DIR`: figures, summary.md + summary.json, one HTML page.

Layout of DIR (one trace: its files directly in DIR; several: one sub-folder per trace plus the
comparison figures in DIR):

    index.html                      interactive page (self-contained; all traces side by side)
    summary.json / summary.md       every number behind the figures, with units
    <label>/fig01_received_*.png|svg, fig03_score_distribution, fig04_attention_maps (when maps are
    stored), fig05_layer_head, fig07_sink_positions, fig10_eps_sweep, table2_sink_tokens.csv|md
    compare_fig10_eps_sweep.png|svg (several traces)
    fig11_block_sinks (block diffusion: sinks across blocks), fig12_sinks_on_edited (an editing
    sampler, LLaDA2.1: sinks on rewritten tokens)
    <label>/readout_*.png|svg: the mechanism analyses (sinklens/report/readouts.py), those the trace
    has data for, beside the random-init control's (--control TRACE)

Causal and block-causal traces (ARMs; SDAR, LLaDA2) get a second set of the sink figures in
`uniform_ratio` units (suffix `_uniform_ratio`): raw column sums carry the baseline uniform
attention already gives early keys (H_S − H_j causally; earlier blocks are seen by more queries),
the rule's `coverage(...).expected` removes it, and the page and summary report both.
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from sinklens.analysis.analyze import Analysis, AnalysisConfig, analyze
from sinklens.analysis.blocks import block_dynamics, edited_sinks
from sinklens.analysis.dynamics import drift_line
from sinklens.analysis.learned_sink import learned_sink_line
from sinklens.analysis.source import AnalysisInputError, ReadoutNotAvailable, as_source
from sinklens.report import figures as F
from sinklens.report import readouts as R
from sinklens.report.folder import check_out_folder
from sinklens.report.html import render_page
from sinklens.report.options import ReportOptions
from sinklens.rule.spec import BASELINE_UNITS


@dataclass
class TraceReport:
    label: str
    folder: Path
    analyses: list[Analysis]                   # [primary] or [primary, uniform_ratio] for causal traces
    figures: dict[str, list[Path]] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    not_available: dict[str, str] = field(default_factory=dict)   # readouts the run did not ask for / that do not apply


@dataclass
class Report:
    out: Path
    traces: list[TraceReport]
    html: Path
    summary_json: Path
    summary_md: Path
    figures: dict[str, list[Path]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)   # what a reader must know about the inputs (--control)


def _control_notes(control: Analysis, path, trace: Analysis) -> list[str]:
    """What the control given is not: a random-init control, one with the trace's readouts."""
    notes = []
    model = control.source.meta.get("model") or {}
    if model and model.get("random_init") is None:
        notes.append(f"--control {path} is not a random-init control (model {model.get('name_or_path')!r} with its "
                     "trained weights); its curves are labelled '(control)'")
    asked = lambda a: {k for k, v in (a.source.meta.get("readouts") or {}).items() if v}   # noqa: E731
    missing = sorted(asked(trace) - asked(control))
    if missing:
        notes.append(f"--control {path} recorded no {', '.join(missing)} readout: those figures show the trace alone "
                     f"(trace the control with the same flags)")
    return notes


def _safe_name(text: str, k: int, used: set[str]) -> str:
    """A file or folder name from a display name: one path component (no '/', never '.' or '..'),
    unique among `used`. Labels are for display; only names made here reach the disk."""
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip(".") or f"trace{k}"
    while name in used:
        name += f"_{k}"
    used.add(name)
    return name


def _label(path_or_obj, k: int, used: set[str]) -> str:
    if isinstance(path_or_obj, (str, os.PathLike)):
        base = Path(os.fspath(path_or_obj)).stem
    else:
        base = getattr(path_or_obj, "label", None) or Path(getattr(path_or_obj, "path", f"trace{k}")).stem
    return _safe_name(base, k, used)


def _figures_for(a: Analysis, folder: Path, opts: ReportOptions, suffix: str, rep: TraceReport,
                 control: Analysis | None = None) -> dict[str, bytes]:
    """Write every figure that applies to this analysis; returns {name: png bytes} for the page."""
    pngs: dict[str, bytes] = {}

    def put(name: str, make):
        try:
            fig = make()
        except ReadoutNotAvailable as e:      # a readout flag left off: not a problem, listed apart
            rep.not_available[name + suffix] = str(e)
            return
        except AnalysisInputError as e:      # e.g. no stored maps: skip this figure, say why
            rep.skipped[name + suffix] = str(e)
            return
        rep.figures[name + suffix] = paths = F.save(fig, folder / (name + suffix))
        pngs[name + suffix] = next(p for p in paths if p.suffix == ".png").read_bytes()   # embedded in the page

    heads = opts.heads or a.pick_heads(3)
    last = a.num_layers - 1
    if not suffix:
        put(f"fig01_received_layer{last}_mean", lambda: F.received_over_steps(a, last, None))
        l0, h0 = a.strongest_sink_head()           # the single-head figure shows the strongest sink
        put(f"fig01_received_layer{l0}_head{h0}", lambda: F.received_over_steps(a, l0, h0))
        put("fig03_score_distribution", lambda: F.score_distribution(a))
        put("fig04_attention_maps", lambda: _maps_figure(a, opts))
    put("fig05_layer_head", lambda: F.layer_head_scores(a))
    put("fig07_sink_positions", lambda: F.sink_positions(a, heads))
    put("fig10_eps_sweep", lambda: F.eps_sweep([a]))
    dyn = block_dynamics(a)
    if dyn is not None and len(dyn.blocks) > 1:   # block diffusion: what carries over from block to block
        put("fig11_block_sinks", lambda: F.block_sinks(a))
    if a.edited is not None:                    # an editing sampler: sinks on rewritten tokens
        put("fig12_sinks_on_edited", lambda: F.sinks_on_edited(a))
    if not suffix:                                 # mechanism readouts, beside the random-init control if given
        for name, make in R.FIGURES.items():
            put(name, lambda make=make: make(a, control))
    return pngs


def _maps_figure(a: Analysis, opts: ReportOptions):
    slices = a.source.map_slices()
    if not slices:
        raise AnalysisInputError(a.source.no_maps_message())
    by_head: dict[tuple[int, int], list[int]] = {}
    for t, l, h in slices:
        by_head.setdefault((l, h), []).append(t)
    (l, h), steps = max(by_head.items(), key=lambda kv: len(kv[1]))
    if opts.map_steps is not None:
        steps = list(opts.map_steps)
    elif len(steps) > 3:
        steps = [steps[0], steps[len(steps) // 2], steps[-1]]
    return F.attention_maps(a, steps, l, h)


def _check_inputs(traces, labels) -> list:
    traces = [traces] if isinstance(traces, (str, os.PathLike)) else list(traces)   # one path is one trace
    if not traces:
        raise AnalysisInputError("give at least one trace to report on")
    if labels is not None and len(labels) != len(traces):
        raise AnalysisInputError(f"labels: {len(labels)} given for {len(traces)} traces; give one label per trace")
    empty = [i + 1 for i, label in enumerate(labels or []) if not str(label).strip()]
    if empty:   # a figure's legend and the page's tabs would have no name for it
        raise AnalysisInputError(f"labels: label {', '.join(map(str, empty))} of {len(labels)} is empty; give each "
                                 "trace a name (e.g. --labels LLaDA,SmolLM2)")
    return traces


def _check_options(src, opts: ReportOptions) -> None:
    """Flags that name a layer, head or step of the trace, checked before any work."""
    for l, h in opts.heads or []:
        src.check_layer_head(l, h)
    for t in opts.map_steps or []:      # --map-steps 9999 was drawn as "not drawn" after the whole analysis
        try:
            src.check_index(t)
        except AnalysisInputError as e:
            raise AnalysisInputError(f"--map-steps: {e}") from None


def _check_control(control: Analysis, a: Analysis, opts: ReportOptions) -> None:
    if (control.num_layers, control.num_heads) != (a.num_layers, a.num_heads):
        raise AnalysisInputError(f"--control {opts.control}: {control.num_layers} layers x {control.num_heads} heads, "
                                 f"but trace '{a.source.label}' has {a.num_layers} x {a.num_heads}; the control must be "
                                 "the same model's shape (its random-init control)")


def _views(src, opts: ReportOptions) -> list[Analysis]:
    """The trace in the units asked for; causal and block-causal attention both give early keys more
    column sum under uniform attention, so those traces get the rule's uniform baseline removed too
    (units uniform_ratio) and the report shows both."""
    cfg = AnalysisConfig(units=opts.units, sink_eps=opts.sink_eps, progress=opts.progress)
    views = [analyze(src, cfg)]
    if (src.causal or src.layout.attention_block) and opts.units != BASELINE_UNITS:
        views.append(analyze(src, dataclasses.replace(cfg, units=BASELINE_UNITS)))
    return views


def _trace_report(rep: TraceReport, opts: ReportOptions, control: Analysis | None, log) -> dict[str, bytes]:
    """Figures and Table 2 of every view of one trace into its folder; {name: png} for the page."""
    pngs: dict[str, bytes] = {}
    for a in rep.analyses:
        suffix = "" if a is rep.analyses[0] else f"_{a.units}"
        if opts.figures:
            t0 = time.perf_counter()
            pngs.update(_figures_for(a, rep.folder, opts, suffix, rep, control))
            log(f"{rep.label} [{a.units}]: figures in {time.perf_counter() - t0:.1f} s")
        F.sink_token_table(a, rep.folder / f"table2_sink_tokens{suffix}")
        rep.figures[f"table2_sink_tokens{suffix}"] = [rep.folder / f"table2_sink_tokens{suffix}.csv",
                                                      rep.folder / f"table2_sink_tokens{suffix}.md"]
    return pngs


def _open_trace(tr, label: str, opts: ReportOptions, log) -> list[Analysis]:
    """One trace read, its flags checked and analysed in every units view it gets."""
    src = as_source(tr, row=opts.row, label=label)
    src.label = label
    _check_options(src, opts)
    t0 = time.perf_counter()
    analyses = _views(src, opts)
    a = analyses[0]
    log(f"{label}: {a.num_steps} steps × {a.num_layers} layers × {a.num_heads} heads, up to {a.tokens.shape[1]} "
        f"tokens, {'causal' if src.causal else 'bidirectional'}; analysed in units "
        f"{', '.join(v.units for v in analyses)} in {time.perf_counter() - t0:.1f} s: {int(a.sink_count.sum())} "
        f"Eq. 3 sinks (ε = {a.config.sink_eps:g})")
    return analyses


def _write_outputs(report: Report, opts: ReportOptions, page_figs: list[dict[str, bytes]], log) -> None:
    """The comparison figure, summary.json / .md and the page."""
    if len(report.traces) > 1 and opts.figures:
        primaries = [r.analyses[0] for r in report.traces]
        report.figures["compare_fig10_eps_sweep"] = F.save(F.eps_sweep(primaries), report.out / "compare_fig10_eps_sweep")
    _write_summary(report, opts)
    opts.page.progress = opts.page.progress or opts.progress
    # one column per trace; a causal trace's uniform_ratio view is a units toggle in its column
    # (report both); the figures go with the trace's first view
    t0 = time.perf_counter()
    render_page([r.analyses for r in report.traces], report.html, opts.page, figures=page_figs)
    log(f"index.html: {report.html.stat().st_size / 1e6:.1f} MB in {time.perf_counter() - t0:.1f} s "
        f"(--html-max-mb {opts.page.max_mb or 0:g})")


def build_report(traces, out: str | os.PathLike, *, labels: list[str] | None = None,
                 options: ReportOptions | None = None) -> Report:
    """Analyse every trace (path, Trace or Source) and write the report into `out`."""
    opts = options or ReportOptions()
    log = opts.log or (lambda message: None)
    traces = _check_inputs(traces, labels)
    out = Path(out)
    check_out_folder(out)
    control = None
    if opts.control:                           # the random-init control of the same shape, beside each readout figure
        control = analyze(as_source(opts.control, row=opts.row, label=_label(opts.control, 0, set())),
                          AnalysisConfig(units=opts.units, sink_eps=opts.sink_eps))
    used: set[str] = set()
    folders: set[str] = set()                  # one folder per trace, named safely from its label
    reps: list[TraceReport] = []
    page_figs: list[dict[str, bytes]] = []
    notes: list[str] = []
    for k, tr in enumerate(traces):
        label = labels[k] if labels else _label(tr, k, used)
        analyses = _open_trace(tr, label, opts, log)
        if control is not None:
            _check_control(control, analyses[0], opts)
            notes = _control_notes(control, opts.control, analyses[0]) if k == 0 else notes
        out.mkdir(parents=True, exist_ok=True)     # made once a trace has been read: a bad one leaves no folder
        rep = TraceReport(label, out if len(traces) == 1 else out / _safe_name(label, k, folders), analyses)
        page_figs.append(_trace_report(rep, opts, control, log))
        for name, why in rep.not_available.items():    # (the skipped ones the CLI prints anyway)
            log(f"{label}: {name} not drawn: {why}")
        reps.append(rep)
    report = Report(out=out, traces=reps, html=out / "index.html", summary_json=out / "summary.json",
                    summary_md=out / "summary.md", notes=notes)
    _write_outputs(report, opts, page_figs, log)
    return report


def _rel(paths, root: Path) -> list[str]:
    return [os.path.relpath(p, root) for p in paths]


def _write_summary(report: Report, opts: ReportOptions) -> None:
    traces = []
    for rep in report.traces:
        d = dict(rep.analyses[0].to_dict())     # a copy: to_dict() is cached
        d["figures"] = {k: _rel(v, report.out) for k, v in rep.figures.items()}
        d["figures_skipped"] = rep.skipped
        d["readouts_not_available"] = rep.not_available
        dyn, ed = block_dynamics(rep.analyses[0]), edited_sinks(rep.analyses[0])
        d["block_dynamics"] = None if dyn is None else dyn.to_dict()     # block diffusion only
        d["edited_sinks"] = None if ed is None else ed.to_dict()         # editing samplers only
        d["source_meta"] = {k: v for k, v in rep.analyses[0].source.meta.items() if k != "tokens_vocab"}
        if len(rep.analyses) > 1:
            d["also"] = [a.to_dict() for a in rep.analyses[1:]]
        traces.append(d)
    doc = {"sinklens_report": 1, "units_note": ("every score is in the units named by the `units` field next to it; "
                                                "`sum` = column sums r_j = Σ_i A[i,j] (multiples of uniform attention)"),
           "notes": report.notes, "traces": traces, "compare_figures": {k: _rel(v, report.out) for k, v in report.figures.items()}}
    with open(report.summary_json, "w", encoding="utf-8") as f:  # streamed: json.dumps would hold the text
        json.dump(doc, f, indent=1, default=_json_default)            # and its millions of pieces at once
    report.summary_md.write_text(_markdown(report), encoding="utf-8")


def _json_default(x):
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, np.ndarray):
        return x.tolist()
    raise TypeError(f"not JSON-serialisable: {type(x).__name__}")


def _markdown(report: Report) -> str:
    lines = ["# sinklens report", "",
             "Scores: `sum` = column sums r_j = Σ_i A[i, j] over real query rows (multiples of uniform attention, "
             "Σ_j r_j = number of queries). Sinks: paper Eq. 3, score_j − mean of the other tokens' scores ≥ ε, "
             "ε applied in the units named. Interactive page: `index.html`. Every number: `summary.json`.", "",
             *[f"Note: {n}\n" for n in report.notes]]
    for rep in report.traces:
        for a in rep.analyses:
            d = a.to_dict()
            sh = d["shape"]
            lines += [f"## {rep.label} — units `{a.units}`, ε = {a.config.sink_eps:g}", "",
                      f"- units: {d['units_meaning']}",
                      *[f"- note: {n}" for n in d["notes"]],
                      f"- shape: {sh['steps']} steps × {sh['layers']} layers × {sh['heads']} heads, up to "
                      f"{sh['max_seq_len']} tokens; {'causal (ARM)' if d['causal'] else 'bidirectional'}",
                      f"- sinks: {d['sinks_total']} (step, layer, head, position) occurrences; "
                      f"{100 * d['fraction_heads_steps_with_sink']:.1f} % of (step, layer, head) have a sink",
                      f"- tracks: " + ", ".join(f"{k} {v}" for k, v in d["track_kinds"].items()),
                      f"- heads: " + ", ".join(f"{k} {v}" for k, v in sorted(d["head_classes"].items())),
                      f"- drift: {drift_line(d['drift'])}",
                      *([f"- learned sink: {learned_sink_line(d['learned_sink'])}"] if d["learned_sink"] else []),
                      f"- masked/unmasked splits: {d['masked_unmasked_splits']['count']} (step, layer, head)"
                      + ("" if a.source.group_names else " (trace has no per-group attention)"),
                      f"- ε sweep at ε = {a.config.sink_eps:g}: "
                      f"{100 * float(np.interp(a.config.sink_eps, a.eps_sweep.eps, a.eps_sweep.fraction)):.2f} % of tokens flagged",
                      ""]
            dyn, ed = block_dynamics(a), edited_sinks(a)
            if dyn is not None:
                lines += [f"- sinks across blocks (at each block's last step): " + ", ".join(
                    f"block {b} {len(n)}" for b, n in zip(dyn.blocks, dyn.sinks)) + "; persist to the next block: "
                    + (", ".join(map(str, dyn.persist)) or "–"), ""]
            if ed is not None:
                lines += [f"- edited tokens: {int(ed.edited_at.sum())} rewrites at {len(ed.positions)} positions; "
                          f"{int(ed.on_edited.sum())} (step, layer, head) sinks sit on an edited token", ""]
            lines += [a.token_table.to_markdown(10), ""]
        lines += ["Figures:", ""] + [f"- `{name}`: " + ", ".join(f"[{Path(p).suffix[1:]}]({os.path.relpath(p, report.out)})"
                                                                   for p in paths)
                                     for name, paths in rep.figures.items()]
        lines += [f"- `{name}` not drawn: {why}" for name, why in rep.skipped.items()]
        if rep.not_available:
            lines += [f"- readouts not recorded or not applicable (see summary.json): {', '.join(sorted(rep.not_available))}"]
        lines += [""]
    if report.figures:
        lines += ["## Comparison", ""] + [f"- `{k}`: " + ", ".join(_rel(v, report.out)) for k, v in report.figures.items()]
    return "\n".join(lines) + "\n"
