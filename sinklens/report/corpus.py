"""`sinklens report CORPUS.jsonl --out DIR`: a corpus run's totals as figures, tables and a page.

A corpus file (sinklens/analysis/corpus.py) holds per-(layer, head) totals over many prompts,
not per-step arrays, so its report has the figures that totals can draw, one set per units view
(a causal model's `uniform_ratio` view gets the suffix `_uniform_ratio`, as trace reports do):

    fig05_layer_head       sink rate (share of (prompt, step) pairs with an Eq. 3 sink) and sinks per step
    fig03_score_distribution   counts of every (prompt, step, layer, head, key) score per bin
    fig10_eps_sweep        share of keys flagged as ε grows
    table2_sink_tokens     .md / .csv: sink occurrences per token and category
    dynamics               .md: track kinds, head classes, largest-sink moves
    every other accumulator (the mechanism readouts, any new analysis): a table of its totals;
    readout_value_norms / _massive / _diagonal_heads / _distance: the trace report's figures,
                           drawn from the totals (sinklens/report/readouts.py CORPUS_FIGURES)
    per trace only         what the corpus does not sum (lens rows, ...): read the kept traces
    summary.json / summary.md, index.html (self-contained: the figures inlined)

Figures of one step or one prompt (Fig. 1, 4, 7) need a trace: report a kept trace
(`traces/` of the run folder) for those.
"""
from __future__ import annotations

import base64
import csv
import html
import io
import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from sinklens.analysis.corpus import CORE_PARTS, Corpus, open_corpus
from sinklens.analysis.source import AnalysisInputError
from sinklens.report.figures import NotebookFigure, save
from sinklens.report.folder import check_out_folder
from sinklens.models.options import control_label
from sinklens.report.readouts import CONTROL, CORPUS_FIGURES, TRAINED, value_norm_ratio
from sinklens.rule.spec import UNITS


@dataclass
class CorpusReport:
    out: Path
    corpus: Corpus
    control: Corpus | None
    html: Path
    summary_json: Path
    summary_md: Path
    figures: dict[str, list[Path]] = field(default_factory=dict)


def layer_head(view: dict, label: str) -> Figure:
    """Sink rate and sinks per step per layer × head over the whole corpus."""
    lh = view["layer_head"]
    rate, count = np.asarray(lh["sink_rate"], float), np.asarray(lh["sinks_per_step"], float)
    L, H = rate.shape
    fig = NotebookFigure(figsize=(min(8 + H * 0.35, 20), min(3.5 + L * 0.22, 12)), layout="constrained")
    ax1, ax2 = fig.subplots(1, 2)
    im = ax1.imshow(rate, aspect="auto", cmap="viridis", vmin=0, vmax=1, interpolation="nearest")
    fig.colorbar(im, ax=ax1, label="share of (prompt, step) pairs with an Eq. 3 sink")
    ax1.set_title("sink rate")
    im2 = ax2.imshow(count, aspect="auto", cmap="Blues", interpolation="nearest")
    fig.colorbar(im2, ax=ax2, label="sinks per step (count, mean over prompts × steps)")
    ax2.set_title(f"number of sinks [units={view['units']}]")
    for ax in (ax1, ax2):
        ax.set_xlabel("head")
        ax.set_ylabel("layer")
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.yaxis.get_major_locator().set_params(integer=True)
    fig.suptitle(f"{label}: {view['prompts']} prompts, {view['steps']} steps")
    return fig


def score_distribution(view: dict, label: str) -> Figure:
    d = view["score_distribution"]
    edges, counts = np.asarray(d["bin_edges"], float), np.asarray(d["counts"], float)
    fig = NotebookFigure(figsize=(6, 4), layout="constrained")
    ax = fig.add_subplot()
    left = edges.copy()
    left[0] = edges[1] / 10                      # bin 0 (below the first edge, zeros too) drawn one decade wide
    right = np.append(edges[1:], edges[-1] * 10)
    ax.bar(left, counts, width=right - left, align="edge")
    ax.set_xscale("log")
    ax.set_yscale("log")
    u = view["units"]
    ax.set_xlabel(f"score in {UNITS[u].label if u in UNITS else u}\n[units={u}] (the first bar: all values < 1e-3)")
    ax.set_ylabel("(prompt, step, layer, head, key) count")
    ax.set_title(f"{label}: score distribution over the corpus")
    return fig


def eps_sweep(view: dict, label: str, eps0: float, control: tuple[str, dict] | None = None) -> Figure:
    """Share of keys flagged as ε grows; `control`: (label, view) of the random-init control, dashed."""
    fig = NotebookFigure(figsize=(6, 4), layout="constrained")
    ax = fig.add_subplot()
    for (name, v), (c, ls) in zip([(label, view), *([control] if control else [])], ((TRAINED, "-"), (CONTROL, "--"))):
        sw = v["eps_sweep"]
        eps, frac = np.asarray(sw["eps"], float), 100 * np.asarray(sw["fraction_flagged"], float)
        ax.plot(eps, frac, marker=".", color=c, ls=ls, label=f"{name} ({np.interp(eps0, eps, frac):.2g} % at ε = {eps0:g})")
    ax.axvline(eps0, color="red", ls=":", lw=1)
    ax.set_ylim(bottom=0)
    u = view["units"]
    ax.set_xlabel(f"ε (Eq. 3 threshold) in {UNITS[u].label if u in UNITS else u}\n[units={u}]")
    ax.set_ylabel("% of keys flagged as sinks")
    ax.set_title("ε sweep over the corpus")
    ax.legend(fontsize=7)
    return fig


def token_markdown(view: dict, top: int = 20) -> str:
    t = view["sink_tokens"]
    show = lambda s: "`" + s.replace("\n", "\\n").replace("|", "\\|").replace("`", "'") + "`"   # noqa: E731
    lines = [f"Sink tokens (fraction of all {t['total_sink_occurrences']} Eq. 3 sink occurrences over prompts × steps "
             "× layers × heads)", "", "| token | id | category | occurrences | fraction |",
             "|---|---:|---|---:|---:|"]
    lines += [f"| {show(r['token'])} | {r['token_id']} | {r['category']} | {r['count']} | {r['fraction']:.3f} |"
              for r in t["tokens"][:top]]
    lines += ["", "| category | occurrences | fraction |", "|---|---:|---:|"]
    lines += [f"| {c} | {v['count']} | {v['fraction']:.3f} |" for c, v in t["categories"].items()]
    return "\n".join(lines) + "\n"


def token_csv(view: dict) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["token", "token_id", "category", "sink_occurrences", "fraction_of_sink_occurrences"])
    for r in view["sink_tokens"]["tokens"]:
        w.writerow([r["token"], r["token_id"], r["category"], r["count"], f"{r['fraction']:.4f}"])
    return buf.getvalue()


def dynamics_markdown(view: dict) -> str:
    d = view["dynamics"]
    kv = lambda o: ", ".join(f"{k} {v}" for k, v in o.items())   # noqa: E731
    return "\n".join([
        "| dynamics (summed over prompts) | |", "|---|---|",
        f"| sink tracks | {kv(d['track_kinds'])} |",
        f"| head classes (heads × prompts) | {kv(d['head_classes'])} |",
        f"| largest sink: moves / rank swaps / vanish / appear | {d['largest_moves']} / {d['largest_rank_swaps']} / "
        f"{d['largest_vanish']} / {d['largest_appear']} |",
        f"| track births / deaths | {d['births']} / {d['deaths']} |",
        f"| masked / unmasked split (step, layer, head) | {view['masked_unmasked_split_steps']} |", ""])


def part_markdown(name: str, t: dict, whose: str = "") -> str:
    """Any accumulator's corpus totals as a table: a {"sum", "n"} pair as its mean over every
    (prompt, step) (overall, and per layer when its first axis is the layer), other numbers as totals.
    `whose`: a note after the name (the control's label)."""
    lines = [f"### {name} (summed over prompts{', ' + whose if whose else ''})", "", "| total | shape | mean over (prompt, step) | per layer |",
             "|---|---|---:|---|"]
    for key, x in _leaves(t):
        if isinstance(x, dict):                                  # {"sum", "n"}
            total, n = np.asarray(x["sum"], float), np.asarray(x["n"], float)
            mean = _fmt(total.sum() / n.sum() if n.sum() else np.nan)
            layer = ", ".join(_fmt(v) for v in _per_layer(total, n)) if total.ndim >= 1 else ""
            lines.append(f"| {key} | {_shape(total)} | {mean} | {layer} |")
        else:
            arr = np.asarray(x, float)
            lines.append(f"| {key} (Σ) | {_shape(arr)} | {_fmt(arr.sum())} | |")
    return "\n".join(lines) + "\n"


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


def per_trace_markdown(view: dict, kept: list[str]) -> str:
    """What the corpus does not sum, and where to read it (the kept traces)."""
    if not view["per_trace_only"]:
        return ""
    where = ", ".join(f"`traces/{k}`" for k in kept) if kept else "none kept: rerun with --keep-traces N"
    lines = ["### per trace only", "", "| analysis | prompts that had it | not summed |", "|---|---:|---|"]
    lines += [f"| {k} | {v['prompts']} | {v['what']} |" for k, v in view["per_trace_only"].items()]
    return "\n".join(lines + ["", f"Read these in the kept traces: {where} (`sinklens report TRACE`).", ""])


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


def layer_rates_markdown(runs: list[tuple[str, dict, dict]]) -> str:
    """Per layer, the corpus beside its control: the sink rate (share of (prompt, step, head) with an
    Eq. 3 sink) and, when value norms were recorded, ||v|| at sinks / at other keys.
    runs: [(label, view, totals)]."""
    rates = [np.nanmean(np.asarray(v["layer_head"]["sink_rate"], float), axis=1) for _, v, _ in runs]
    ratios = [value_norm_ratio(t["sink_vectors"]) if "value_norm_ratio" in t.get("sink_vectors", {}) else None
              for _, _, t in runs]
    head = ["layer"] + [f"sink rate, {label}" for label, _, _ in runs] + [
        f"‖v‖ sinks / others, {label}" for (label, _, _), r in zip(runs, ratios) if r is not None]
    lines = ["Per layer, pooled over every (prompt, step) (sink rate: share of (prompt, step, head) with an Eq. 3 "
             "sink; ‖v‖: mean at the sinks / mean at the other keys):", "",
             "| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    for l in range(len(rates[0])):
        cells = [str(l)] + [_fmt(r[l]) for r in rates] + [_fmt(r[l]) for r in ratios if r is not None]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def build_corpus_report(path, out, *, figures: bool = True, control=None) -> CorpusReport:
    """Read a corpus file and write its report into `out`; `control`: the corpus file of its
    random-init control (same shape), drawn beside it in every readout figure and table."""
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
    pngs: list[tuple[str, bytes]] = []
    md = [f"# Corpus report: {label}", "", f"{c.num_prompts} prompts from `{Path(str(d['prompts_file'])).name}`, "
          f"{d['num_layers']} layers × {d['num_heads']} heads; sink rule Eq. 3, ε = {d['sink_eps']:g}; "
          f"skipped {len(d['skipped'])} lines (summary.json lists each as file:line).", ""]
    if ctrl is not None:
        md += [f"Control: {clabel}, {ctrl.num_prompts} prompts from `{Path(str(cd['prompts_file'])).name}` "
               f"(`{Path(ctrl.path).name}`), drawn dashed / grey beside the corpus; its numbers are under "
               "\"control\" in summary.json.", ""]

    def put(name: str, fig: Figure) -> None:
        rep.figures[name] = save(fig, out / name)
        pngs.append((name, rep.figures[name][0].read_bytes()))

    for k, (units, view) in enumerate(d["views"].items()):
        suffix = "" if k == 0 else f"_{units}"
        cview = cd["views"].get(units) if cd is not None else None
        ctotals = ctrl.totals.get(units) if ctrl is not None else None
        md += [f"## units {units}", "", f"{view['units_meaning']}", "",
               f"- (prompt, step, layer, head) with a sink: {100 * view['fraction_heads_steps_with_sink']:.3g} %"
               + (f" (control: {100 * cview['fraction_heads_steps_with_sink']:.3g} %)" if cview else ""),
               f"- sink occurrences: {view['sinks_total']}" + (f" (control: {cview['sinks_total']})" if cview else ""),
               ""]
        if ctrl is not None and cview is None:
            md += [f"(the control holds no {units} view: {', '.join(ctrl.totals)} only)", ""]
        tok_md = token_markdown(view)
        (out / f"table2_sink_tokens{suffix}.md").write_text(tok_md, encoding="utf-8")
        (out / f"table2_sink_tokens{suffix}.csv").write_text(token_csv(view), encoding="utf-8")
        rep.figures[f"table2_sink_tokens{suffix}"] = [out / f"table2_sink_tokens{suffix}.md",
                                                      out / f"table2_sink_tokens{suffix}.csv"]
        md += [tok_md, dynamics_markdown(view)]
        if cview:
            md += [f"Control ({clabel}):", "", token_markdown(cview), dynamics_markdown(cview)]
            md.append(layer_rates_markdown([(label, view, c.totals[units]), (clabel, cview, ctotals)]))
        if figures:
            put(f"fig05_layer_head{suffix}", layer_head(view, label))
            if cview:
                put(f"fig05_layer_head_control{suffix}", layer_head(cview, clabel))
            put(f"fig03_score_distribution{suffix}", score_distribution(view, label))
            put(f"fig10_eps_sweep{suffix}", eps_sweep(view, label, d["sink_eps"], (clabel, cview) if cview else None))
        # every other accumulator's totals (the readouts, a new analysis): a table each, and the
        # trace report's figure drawn from the totals where there is one, the control's beside them
        totals = c.totals[units]
        for acc in (k for k in totals if k not in CORE_PARTS):
            md.append(part_markdown(acc, totals[acc]))
            if ctotals is not None and acc in ctotals:
                md.append(part_markdown(acc, ctotals[acc], f"control, {clabel}"))
            if figures and acc in CORPUS_FIGURES:
                name, draw = CORPUS_FIGURES[acc]
                runs = [(label, totals[acc])] + ([(clabel, ctotals[acc])] if ctotals is not None and acc in ctotals
                                                 else [])
                try:
                    fig = draw(runs, units)
                except AnalysisInputError as e:
                    md.append(f"({name} not drawn: {e})\n")
                    continue
                put(name + suffix, fig)
                md.append(f"Figure: `{name + suffix}.png`\n")
        md.append(per_trace_markdown(view, list(d.get("kept_traces") or [])))
    summary = {**d, "label": label, **({"control": {**cd, "label": clabel}} if cd is not None else {})}
    rep.summary_json.write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")
    rep.summary_md.write_text("\n".join(md), encoding="utf-8")
    rep.html.write_text(_page(label, md, pngs), encoding="utf-8")
    return rep


def _page(title: str, md: list[str], pngs: list[tuple[str, bytes]]) -> str:
    """One self-contained page: the summary (as preformatted text) and the figures inlined."""
    imgs = "".join(f"<figure><img alt='{html.escape(n)}' src='data:image/png;base64,"
                   f"{base64.b64encode(b).decode()}'><figcaption>{html.escape(n)}</figcaption></figure>"
                   for n, b in pngs)
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            "<style>body{font-family:sans-serif;max-width:1200px;margin:auto}img{max-width:100%}"
            "pre{white-space:pre-wrap}</style></head><body>"
            f"<h1>Corpus report: {html.escape(title)}</h1><pre>{html.escape(chr(10).join(md))}</pre>{imgs}"
            "</body></html>\n")
