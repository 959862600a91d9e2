"""`sinklens report CORPUS.jsonl --out DIR` (or the run folder DIR holding it): a corpus run's totals
as figures, tables and a page in the trace page's style.

A corpus file (sinklens/analysis/corpus.py) holds per-(layer, head) totals over many prompts,
not per-step arrays, so its report has what totals can show, one set per units view (a causal
model's `uniform_ratio` view gets the suffix `_uniform_ratio`, as trace reports do), each with the
random-init control (--control) beside it on the same scale:

    fig05_layer_head       sink rate (share of (prompt, step) pairs with an Eq. 3 sink) and sinks per step
    fig03_score_distribution   counts of every (prompt, step, layer, head, key) score per bin
    fig10_eps_sweep        share of keys flagged as ε grows
    table2_sink_tokens     .md / .csv: sink occurrences per token and category
    every other accumulator (the mechanism readouts, any new analysis): a table of its totals;
    readout_value_norms / _massive / _diagonal_heads / _distance: the trace report's figures,
                           drawn from the totals (sinklens/report/readouts.py CORPUS_FIGURES)
    per trace only         what the corpus does not sum (lens rows, ...): read the kept traces
    summary.json / summary.md, index.html (self-contained: HTML tables, the figures inlined, and
                           every per-(layer, head) total browsable beside the control's)

The text is built once as sections (sinklens/report/doc.py) and written as summary.md and as the
page. Figures of one step or one prompt (Fig. 1, 4, 7) need a trace: report a kept trace
(`traces/` of the run folder) for those.
"""
from __future__ import annotations

import csv
import html
import io
import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from sinklens.analysis.corpus import CORE_PARTS, Corpus, open_corpus
from sinklens.analysis.source import AnalysisInputError
from sinklens.models.options import control_label
from sinklens.report import corpus_figures as CF
from sinklens.report.doc import Section, Table, html_sections, markdown
from sinklens.report.figures import save
from sinklens.report.folder import check_out_folder
from sinklens.report.html import HERE, colormap, script
from sinklens.report.readouts import CORPUS_FIGURES, value_norm_ratio


@dataclass
class CorpusReport:
    out: Path
    corpus: Corpus
    control: Corpus | None
    html: Path
    summary_json: Path
    summary_md: Path
    figures: dict[str, list[Path]] = field(default_factory=dict)


@dataclass
class Run:
    """One corpus in one units view: its label, `Corpus.to_dict()` view and raw totals."""
    label: str
    view: dict
    totals: dict


# ---- tables ---------------------------------------------------------------------------------------
def _token(s: str) -> str:
    return "`" + s.replace("\n", "\\n").replace("`", "'") + "`"


def token_tables(run: Run, top: int = 20) -> list[Table]:
    """Table 2 over the corpus: sink occurrences per token, then per category."""
    t = run.view["sink_tokens"]
    tokens = Table(["token", "id", "category", "occurrences", "fraction"],
                   [[_token(r["token"]), str(r["token_id"]), r["category"], str(r["count"]), f"{r['fraction']:.3f}"]
                    for r in t["tokens"][:top]],
                   caption=f"{run.label}: sink tokens (fraction of all {t['total_sink_occurrences']} Eq. 3 sink "
                           "occurrences over prompts × steps × layers × heads)")
    cats = Table(["category", "occurrences", "fraction"],
                 [[c, str(v["count"]), f"{v['fraction']:.3f}"] for c, v in t["categories"].items()],
                 caption=f"{run.label}: by category")
    return [tokens, cats]


def token_markdown(view: dict, top: int = 20) -> str:
    """Table 2 as Markdown (table2_sink_tokens.md)."""
    from sinklens.report.doc import table_markdown

    return "\n".join(table_markdown(t) for t in token_tables(Run("corpus", view, {}), top))


def token_csv(view: dict) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["token", "token_id", "category", "sink_occurrences", "fraction_of_sink_occurrences"])
    for r in view["sink_tokens"]["tokens"]:
        w.writerow([r["token"], r["token_id"], r["category"], r["count"], f"{r['fraction']:.4f}"])
    return buf.getvalue()


def dynamics_table(run: Run) -> Table:
    d, v = run.view["dynamics"], run.view
    kv = lambda o: ", ".join(f"{k} {n}" for k, n in o.items())   # noqa: E731
    return Table(["dynamics (summed over prompts)", ""], [
        ["sink tracks", kv(d["track_kinds"])],
        ["head classes (heads × prompts)", kv(d["head_classes"])],
        ["largest sink: moves / rank swaps / vanish / appear",
         f"{d['largest_moves']} / {d['largest_rank_swaps']} / {d['largest_vanish']} / {d['largest_appear']}"],
        ["track births / deaths", f"{d['births']} / {d['deaths']}"],
        ["masked / unmasked split (step, layer, head)", str(v["masked_unmasked_split_steps"])]],
        caption=run.label, numeric=False)


def part_table(name: str, t: dict, whose: str) -> Table:
    """Any accumulator's corpus totals: a {"sum", "n"} pair as its mean over every (prompt, step)
    (overall, and per layer when its first axis is the layer), other numbers as totals."""
    rows = []
    for key, x in _leaves(t):
        if isinstance(x, dict):                                  # {"sum", "n"}
            total, n = np.asarray(x["sum"], float), np.asarray(x["n"], float)
            mean = _fmt(total.sum() / n.sum() if n.sum() else np.nan)
            layer = ", ".join(_fmt(v) for v in _per_layer(total, n)) if total.ndim >= 1 else ""
            rows.append([key, _shape(total), mean, layer])
        else:
            arr = np.asarray(x, float)
            rows.append([f"{key} (Σ)", _shape(arr), _fmt(arr.sum()), ""])
    return Table(["total", "shape", "mean over (prompt, step)", "per layer"], rows, caption=f"{name}: {whose}")


def _leaves(t: dict, prefix: str = ""):
    """(dotted key, leaf): {"sum", "n"} pairs and numeric arrays / numbers; strings skipped."""
    for k, v in t.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and set(v) == {"sum", "n"}:
            yield key, v
        elif isinstance(v, dict):
            yield from _leaves(v, f"{key}.")
        elif not isinstance(v, str):
            yield key, v


def _per_layer(total: np.ndarray, n: np.ndarray) -> np.ndarray:
    axes = tuple(range(1, total.ndim))
    with np.errstate(all="ignore"):
        return total.sum(axis=axes) / n.sum(axis=axes)


def _shape(x: np.ndarray) -> str:
    return "×".join(map(str, x.shape)) or "1"


def _fmt(v) -> str:
    return "—" if not np.isfinite(v) else f"{v:.4g}"


def per_trace_table(view: dict, kept: list[str]) -> Section | None:
    """What the corpus does not sum, and where to read it (the kept traces)."""
    if not view["per_trace_only"]:
        return None
    where = ", ".join(f"`traces/{k}`" for k in kept) if kept else "none kept: rerun with --keep-traces N"
    return Section("per trace only", 3, view["units"],
                   text=[f"Read these in the kept traces: {where} (`sinklens report TRACE`)."],
                   tables=[Table(["analysis", "prompts that had it", "not summed"],
                                 [[k, str(v["prompts"]), v["what"]] for k, v in view["per_trace_only"].items()])])


def layer_rates_table(runs: list[Run]) -> Table:
    """Per layer, the corpus beside its control: the sink rate (share of (prompt, step, head) with an
    Eq. 3 sink) and, when value norms were recorded, ||v|| at sinks / at other keys."""
    rates = [np.nanmean(np.asarray(r.view["layer_head"]["sink_rate"], float), axis=1) for r in runs]
    ratios = [value_norm_ratio(r.totals["sink_vectors"]) if "value_norm_ratio" in r.totals.get("sink_vectors", {})
              else None for r in runs]
    head = ["layer"] + [f"sink rate, {r.label}" for r in runs] + [
        f"‖v‖ sinks / others, {r.label}" for r, x in zip(runs, ratios) if x is not None]
    rows = [[str(l)] + [_fmt(r[l]) for r in rates] + [_fmt(x[l]) for x in ratios if x is not None]
            for l in range(len(rates[0]))]
    return Table(head, rows, caption="Per layer, pooled over every (prompt, step) (sink rate: share of (prompt, step, "
                                     "head) with an Eq. 3 sink; ‖v‖: mean at the sinks / mean at the other keys)")


# ---- the per-(layer, head) browser --------------------------------------------------------------------
def layer_head_metrics(run: Run, L: int, H: int) -> dict[str, tuple[str, np.ndarray]]:
    """Every (L, H) quantity of one run: {name: (what it is, values)} — the core rates, each
    accumulator's (L, H) means over every (prompt, step), the dynamics counts summed over prompts."""
    lh = run.view["layer_head"]
    out = {"sink rate": ("share of (prompt, step) pairs with an Eq. 3 sink", lh["sink_rate"]),
           "sinks per step": ("Eq. 3 sinks per step, mean over prompts × steps", lh["sinks_per_step"]),
           "largest sink score": (f"score of the largest sink, mean over the steps with one [units={run.view['units']}]",
                                  lh["largest_sink_score_mean"]),
           "top score": (f"largest key score, mean over prompts × steps [units={run.view['units']}]", lh["top_score_mean"])}
    for acc in (k for k in run.totals if k not in CORE_PARTS):
        for key, x in _leaves(run.totals[acc]):
            if isinstance(x, dict) and np.shape(x["sum"]) == (L, H):
                with np.errstate(all="ignore"):
                    mean = np.asarray(x["sum"], float) / np.asarray(x["n"], float)
                out[f"{acc}.{key}"] = ("mean over every (prompt, step) that had it", mean)
    for key, x in run.view["dynamics"]["per_layer_head"].items():
        if np.shape(x) == (L, H):
            out[f"dynamics.{key}"] = ("count, summed over prompts", x)
    return {k: (what, np.asarray(v, float)) for k, (what, v) in out.items()}


def _cells(x: np.ndarray) -> list:
    return [[float(f"{v:.4g}") if np.isfinite(v) else None for v in row] for row in x]


def layer_head_panel(runs: list[Run], L: int, H: int) -> str:
    """The page's per-(layer, head) panel (sinklens/report/corpus.js): the corpus' and the control's
    values of every (L, H) quantity, the strongest head first."""
    mine = layer_head_metrics(runs[0], L, H)
    theirs = [layer_head_metrics(r, L, H) for r in runs[1:]]
    rate = np.nan_to_num(np.asarray(runs[0].view["layer_head"]["sink_rate"], float))
    data = {"L": L, "H": H, "labels": [r.label for r in runs],
            "start": [int(i) for i in np.unravel_index(np.argmax(rate), rate.shape)],
            "metrics": {k: {"what": what, "runs": [_cells(x)] + [_cells(t[k][1]) if k in t else None for t in theirs]}
                        for k, (what, x) in mine.items()}}
    text = json.dumps(data, separators=(",", ":")).replace("<", "\\u003c")
    return f"<div class='sl-lh'><script type='application/json'>{text}</script></div>"


# ---- sections ---------------------------------------------------------------------------------------
def _run_section(c: Corpus, d: dict, label: str, ctrl: Corpus | None, clabel: str | None) -> Section:
    rows = [["model", f"`{d['model']}`"],
            ["prompts", f"{c.num_prompts} from `{Path(str(d['prompts_file'])).name}`"],
            ["shape", f"{d['num_layers']} layers × {d['num_heads']} heads; "
                      f"{'causal (ARM)' if d['causal'] else 'bidirectional'}"],
            ["sink rule", f"paper Eq. 3, ε = {d['sink_eps']:g}"],
            ["units views", ", ".join(d["views"])],
            ["skipped lines", f"{len(d['skipped'])} (summary.json lists each as file:line)"],
            ["kept traces", ", ".join(f"`traces/{k}`" for k in d.get("kept_traces") or []) or "none"]]
    if ctrl is not None:
        cd = ctrl.to_dict()
        rows.append(["control", f"{clabel}, {ctrl.num_prompts} prompts from `{Path(str(cd['prompts_file'])).name}` "
                                f"(`{Path(ctrl.path).name}`): dashed / grey in the figures, beside the corpus in the "
                                "tables; its numbers are under \"control\" in summary.json"])
    return Section("Run", text=["Every number: `summary.json`. Figures of one step or one prompt (Fig. 1, 4, 7) need "
                                "a trace: report a kept trace for those."],
                   tables=[Table(["", label], rows, numeric=False)])


def _headline(runs: list[Run]) -> Table:
    v = [r.view for r in runs]
    return Table(["", *(r.label for r in runs)], [
        ["(prompt, step, layer, head) with a sink", *(f"{100 * x['fraction_heads_steps_with_sink']:.3g} %" for x in v)],
        ["sink occurrences", *(str(x["sinks_total"]) for x in v)],
        ["prompts, steps", *(f"{x['prompts']}, {x['steps']}" for x in v)]])


def _view_sections(runs: list[Run], units: str, suffix: str, ctrl_units: list[str] | None, L: int, H: int,
                   kept: list[str]) -> list[Section]:
    """One units view: headline and core figures, per-(layer, head) browser, Table 2, dynamics, every
    accumulator's totals with its figure; the control's beside each."""
    run = runs[0]
    top = Section(f"units {units}", units=units, text=[str(run.view["units_meaning"])], tables=[_headline(runs)],
                  figures=[f"fig05_layer_head{suffix}", f"fig03_score_distribution{suffix}", f"fig10_eps_sweep{suffix}"])
    if ctrl_units is not None and len(runs) == 1:
        top.text.append(f"(the control holds no {units} view: {', '.join(ctrl_units)} only)")
    out = [top,
           Section(f"Per (layer, head) [units={units}]", 3, units, html=layer_head_panel(runs, L, H),
                   text=["Pick a quantity, then a head (click the grid or the pickers); the control is drawn beside "
                         "the corpus on the same colour scale."], tables=[layer_rates_table(runs)]),
           Section("Sink tokens", 3, units, beside=len(runs),
                   tables=[t for pair in zip(*(token_tables(r) for r in runs)) for t in pair]),
           Section("Dynamics", 3, units, beside=len(runs), tables=[dynamics_table(r) for r in runs])]
    for acc in (k for k in run.totals if k not in CORE_PARTS):
        sec = Section(f"{acc} (summed over prompts)", 3, units, beside=len(runs),
                      tables=[part_table(acc, r.totals[acc], r.label) for r in runs if acc in r.totals])
        if acc in CORPUS_FIGURES:
            sec.figures.append(CORPUS_FIGURES[acc][0] + suffix)
        out.append(sec)
    trace_only = per_trace_table(run.view, kept)
    return out + ([trace_only] if trace_only else [])


def _draw(runs: list[Run], suffix: str, eps: float, put) -> list[str]:
    """Every figure of one units view through `put(name, make)`; returns lines on what was not drawn."""
    views = [(r.label, r.view) for r in runs]
    put(f"fig05_layer_head{suffix}", lambda: CF.layer_head(views))
    put(f"fig03_score_distribution{suffix}", lambda: CF.score_distribution(views))
    put(f"fig10_eps_sweep{suffix}", lambda: CF.eps_sweep(views, eps))
    missing = []
    for acc in (k for k in runs[0].totals if k in CORPUS_FIGURES):
        name, draw = CORPUS_FIGURES[acc]
        try:
            put(name + suffix, lambda: draw([(r.label, r.totals[acc]) for r in runs if acc in r.totals],
                                            runs[0].view["units"]))
        except AnalysisInputError as e:
            missing.append(f"({name} not drawn: {e})")
    return missing


def open_control(path, c: Corpus) -> Corpus:
    """The control corpus of `c` (--control): a corpus file of the same shape, else one line why not."""
    from sinklens.analysis.corpus import is_corpus_file

    if not is_corpus_file(path):
        raise AnalysisInputError(f"--control {path}: not a corpus file; a corpus report takes the control's corpus.jsonl "
                                 "(`sinklens trace --prompts ... --random-init SEED`), a trace report the control's trace")
    ctrl = open_corpus(path)
    mine, theirs = [(x.meta["num_layers"], x.meta["num_heads"]) for x in (c, ctrl)]
    if mine != theirs:
        raise AnalysisInputError(f"--control {path}: {theirs[0]} layers x {theirs[1]} heads, but the corpus has {mine[0]} x "
                                 f"{mine[1]}; the control must be the same model's shape (its random-init control)")
    return ctrl


def corpus_label(c: Corpus) -> str:
    """The model's name, with "(random init, seed N)" when the corpus is a random-init control."""
    return control_label(str(c.meta["model"]), c.meta.get("random_init"))


def build_corpus_report(path, out, *, figures: bool = True, control=None) -> CorpusReport:
    """Read a corpus file and write its report into `out`; `control`: the corpus file of its
    random-init control (same shape), drawn beside it in every figure and table."""
    c = open_corpus(path)
    ctrl = open_control(control, c) if control is not None else None
    out = Path(out)
    check_out_folder(out)
    out.mkdir(parents=True, exist_ok=True)
    d = c.to_dict()
    cd = ctrl.to_dict() if ctrl is not None else None
    rep = CorpusReport(out=out, corpus=c, control=ctrl, html=out / "index.html", summary_json=out / "summary.json",
                       summary_md=out / "summary.md")
    label = corpus_label(c)
    clabel = corpus_label(ctrl) if ctrl is not None else None
    pngs: dict[str, bytes] = {}

    def put(name: str, make) -> None:
        rep.figures[name] = save(make(), out / name)
        pngs[name] = rep.figures[name][0].read_bytes()

    sections = [_run_section(c, d, label, ctrl, clabel)]
    for k, (units, view) in enumerate(d["views"].items()):
        suffix = "" if k == 0 else f"_{units}"
        runs = [Run(label, view, c.totals[units])]
        if cd is not None and units in cd["views"]:
            runs.append(Run(clabel, cd["views"][units], ctrl.totals[units]))
        (out / f"table2_sink_tokens{suffix}.md").write_text(token_markdown(view), encoding="utf-8")
        (out / f"table2_sink_tokens{suffix}.csv").write_text(token_csv(view), encoding="utf-8")
        rep.figures[f"table2_sink_tokens{suffix}"] = [out / f"table2_sink_tokens{suffix}.md",
                                                      out / f"table2_sink_tokens{suffix}.csv"]
        view_secs = _view_sections(runs, units, suffix, list(ctrl.totals) if ctrl is not None else None,
                                   d["num_layers"], d["num_heads"], list(d.get("kept_traces") or []))
        if figures:
            view_secs[0].text += _draw(runs, suffix, d["sink_eps"], put)
        else:
            for s in view_secs:
                s.figures = []
        sections += view_secs
    summary = {**d, "label": label, **({"control": {**cd, "label": clabel}} if cd is not None else {})}
    rep.summary_json.write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")
    rep.summary_md.write_text(f"# Corpus report: {label}\n\n" + markdown(sections), encoding="utf-8")
    rep.html.write_text(_page(label, list(d["views"]), sections, pngs), encoding="utf-8")
    return rep


def _page(label: str, views: list[str], sections: list[Section], pngs: dict[str, bytes]) -> str:
    """One self-contained page in the trace viewer's style: the sections as cards with HTML tables,
    the figures inlined, a units picker when there are several views."""
    css = (HERE / "viewer.css").read_text(encoding="utf-8")
    js = script("corpus.js")
    picker = ("<label class='sl-pick'>units <select id='sl-units'>" + "".join(
        f"<option value='{html.escape(u)}'>{html.escape(u)}</option>" for u in views) + "</select></label>"
              if len(views) > 1 else "")
    return (f"<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
            "<meta name='viewport' content='width=device-width, initial-scale=1'>"
            f"<title>Corpus report: {html.escape(label)}</title><link rel='icon' href='data:,'><style>{css}</style></head>\n"
            "<body style='margin:0; background:#fafafa'><div class='sl-page' id='sl-page'>"
            f"<header><h1>Corpus report: {html.escape(label)}</h1><p class='note'>Self-contained (no network). A corpus "
            "run's totals over every prompt; sinks are the paper's Eq. 3 (score − mean of the other tokens ≥ ε). "
            f"{picker}</p></header>\n<main class='sl-viewers sl-corpus' style='--n:1'>\n{html_sections(sections, pngs)}\n"
            f"</main><script type='application/json' id='sl-cmap'>{json.dumps(colormap(), separators=(',', ':'))}"
            f"</script><script>{js}</script></div></body></html>\n")
