"""Figures of the mechanism analyses (docs/analysis.md, "Mechanism readouts"), each with the
random-init control of the same shape beside it when one is given (dashed / grey).

| analysis                         | function            | needs the readout    |
|----------------------------------|---------------------|----------------------|
| k·σ rule beside Eq. 3            | `k_sigma`           | — (received only)    |
| absorption, position variance    | `absorption`        | —                    |
| mask-query ranking               | `mask_ranking`      | — (masked / unmasked groups) |
| value norm vs received attention | `value_norms`       | value_norms          |
| massive activations over steps   | `massive`           | hidden_norms         |
| diagonal vs sink heads           | `diagonal_heads`    | diagonal             |
| received attention vs distance   | `distance`          | distance             |
| logit-lens table                 | `logit_lens`        | lens_layers          |

Each function raises AnalysisInputError (the report skips the figure and says why) when its
analysis is empty on this trace. `readout_figures(a, control)` gives all that apply, by file name.
A corpus report draws value norms, massive activations, diagonal heads and distance from the
corpus totals with the same drawing code (`CORPUS_FIGURES`: means over every (prompt, step)).
"""
from __future__ import annotations

import matplotlib
import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import LogFormatter

from sinklens.analysis.analyze import Analysis
from sinklens.analysis.readouts import HEAD_SHARE, SCORE_BINS, nanmean
from sinklens.analysis.source import AnalysisInputError, ReadoutNotAvailable
from sinklens.models.options import control_label
from sinklens.report.figures import NotebookFigure, fit_colorbar_labels, integer_ticks
from sinklens.rule.spec import UNITS

TRAINED, CONTROL = "C0", "0.55"   # colours: the trace, its random-init control


def _fig(n: int = 1, width: float = 9.0, height: float = 3.4) -> tuple[Figure, list]:
    fig = NotebookFigure(figsize=(width, height), layout="constrained")
    return fig, list(np.atleast_1d(fig.subplots(1, n)))


def _need(a: Analysis, name: str, readout: str | None):
    value = getattr(a, name)
    if value is None and readout:
        raise ReadoutNotAvailable(f"trace '{a.source.label}' recorded no {readout} readout (trace it with "
                                 f"--{readout.replace('_', '-')})")
    if value is None:
        raise AnalysisInputError(f"trace '{a.source.label}' has nothing for {name}")
    return value


def _pairs(a: Analysis, control: Analysis | None, name: str, readout: str | None):
    """[(label, analysis result, colour, line style)] for the trace and, when it has it, the control."""
    out = [(a.source.label, _need(a, name, readout), TRAINED, "-")]
    if control is not None and getattr(control, name) is not None:
        seed = (control.source.meta.get("model") or {}).get("random_init")   # recorded by load(random_init=...)
        # a control not loaded with random_init (another trace given as --control) is not called one
        label = control_label(control.source.label, seed) if seed is not None else f"{control.source.label} (control)"
        out.append((label, getattr(control, name), CONTROL, "--"))
    return out


def k_sigma(a: Analysis, control: Analysis | None = None) -> Figure:
    fig, (ax0, ax1) = _fig(2)
    for label, ks, c, ls in _pairs(a, control, "k_sigma", None):
        ax0.plot([len(p) for p in ks.positions], color=c, ls=ls, label=f"{label}: k·σ (k = {ks.k:g})")
        ax0.plot([len(p) for p in ks.eq3_positions], color=c, ls=":", label=f"{label}: Eq. 3 in some head")
        ax1.plot(ks.jaccard, color=c, ls=ls, label=label)
    ax0.set(xlabel="step index", ylabel="sink keys per step", title="mean + k·σ rule beside Eq. 3")
    ax1.set(xlabel="step index", ylabel="Jaccard(k·σ, Eq. 3 any head)", ylim=(-0.02, 1.02), title="agreement")
    integer_ticks(ax0, "xy")
    integer_ticks(ax1, "x")
    ax0.legend(fontsize=7)
    ax1.legend(fontsize=7)
    return fig


def absorption(a: Analysis, control: Analysis | None = None) -> Figure:
    fig, (ax0, ax1) = _fig(2)
    for label, ab, c, ls in _pairs(a, control, "absorption", None):
        ax0.plot(ab.rate.mean(axis=(1, 2)), color=c, ls=ls, label=label)
    ax0.set(xlabel="step index", ylabel="Σ_{j ∈ sinks} r_j / Σ r_j\n(mean over heads)", ylim=(-0.02, 1.02),
            title="absorption rate")
    integer_ticks(ax0, "x")
    ax0.legend(fontsize=7)
    var = a.absorption.position_variance()
    cm = matplotlib.colormaps["viridis"].with_extremes(bad="white")
    im = ax1.imshow(np.sqrt(var), aspect="auto", cmap=cm, interpolation="nearest")
    bar = fig.colorbar(im, ax=ax1, label="σ of the largest sink's position over steps (positions)")
    ax1.set(xlabel="head", ylabel="layer", title=f"sink-position spread, {a.source.label}\n(white: < 2 steps with a sink)")
    ax1.title.set_fontsize(10)
    integer_ticks(ax1, "xy")
    fit_colorbar_labels(fig, [bar])
    return fig


def mask_ranking(a: Analysis, control: Analysis | None = None) -> Figure:
    if a.mask_query_ranking is None and "masked" not in a.source.group_names:
        raise ReadoutNotAvailable(f"trace '{a.source.label}' has no masked query rows to rank keys by (an ARM, "
                                  "or a DLM traced with --no-groups)")
    fig, (ax,) = _fig(1, 6.5)
    for label, rows, c, ls in _pairs(a, control, "mask_query_ranking", None):
        ax.plot([r["step"] for r in rows], [r["overlap"] for r in rows], color=c, ls=ls, marker=".", label=label)
    ax.set(xlabel="step", ylabel="overlap of the top keys (0..1)", ylim=(-0.02, 1.02),
           title="keys ranked by masked queries vs by all queries")
    integer_ticks(ax, "x")
    ax.legend(fontsize=7)
    return fig


def value_norms(a: Analysis, control: Analysis | None = None) -> Figure:
    series = []
    for label, sv, c, ls in _pairs(a, control, "sink_vectors", "value_norms"):
        if "value_norm" in sv.seen:
            series.append((label, c, ls, _mean(sv.bin_sum, sv.bin_count), nanmean(sv.ratio("value_norm"), axis=(0, 2))))
    return _value_norms(series, a.units)


def _value_norms(series, units: str) -> Figure:
    """series: [(label, colour, style, (bins,) mean ||v|| per score bin, (L,) mean sink / other ratio)]."""
    fig, (ax0, ax1) = _fig(2)
    centres = np.arange(len(SCORE_BINS) - 1)
    for label, c, ls, by_score, layer_ratio in series:
        ax0.plot(centres, by_score, color=c, ls=ls, marker="o", label=label)
        ax1.plot(layer_ratio, color=c, ls=ls, marker="o", label=label)
    ax0.set_xticks(centres, [f"≥{x:g}" for x in SCORE_BINS[:-1]], fontsize=7)
    ax0.set(xlabel=f"received score [{UNITS[units].label if units in UNITS else units}]", ylabel="mean ||v_j||",
            title="value norm by received")
    ax1.axhline(1.0, color="k", lw=0.5)
    ax1.set(xlabel="layer", ylabel="||v|| at sinks / at other keys", title="do sinks carry low-norm values?")
    integer_ticks(ax1, "x")
    ax0.legend(fontsize=7)
    return fig


def massive(a: Analysis, control: Analysis | None = None) -> Figure:
    return _massive([(label, c, ls, nanmean(ma.ratio, axis=0), nanmean(ma.ratio_all, axis=0),
                      nanmean(ma.sink_norm_ratio, axis=0))
                     for label, ma, c, ls in _pairs(a, control, "massive_activations", "hidden_norms")])


def _massive(series) -> Figure:
    """series: [(label, colour, style, (L,) largest |h_c| / the median position's largest, (L,) / the
    median |h_c| of all activations (Sun et al. 2024; NaN: not recorded), (L,) sink norm ratio)],
    each a mean over steps (and prompts)."""
    fig, (ax0, ax1) = _fig(2)
    for label, c, ls, ratio, ratio_all, sink_norm in series:
        ax0.plot(ratio, color=c, ls=ls, marker="o", label=f"{label}: ÷ median position's largest |h_c|")
        if np.isfinite(ratio_all).any():
            ax0.plot(ratio_all, color=c, ls=ls, marker="s", mfc="none", alpha=0.7,
                     label=f"{label}: ÷ median |h_c| of all (Sun et al.)")
        ax1.plot(sink_norm, color=c, ls=ls, marker="o", label=label)
    ax0.set(xlabel="layer", ylabel="largest |h_c| / median", yscale="log",
            title="massive activations (mean over steps)")
    ax0.yaxis.set_major_formatter(LogFormatter())                       # 2, 30: not 2×10^0, 3×10^1
    ax0.yaxis.set_minor_formatter(LogFormatter(minor_thresholds=(2, 0.5)))
    ax1.axhline(1.0, color="k", lw=0.5)
    ax1.set(xlabel="layer", ylabel="||h|| at the strongest sink / median ||h||", title="residual norm at sinks")
    integer_ticks(ax0, "x")
    integer_ticks(ax1, "x")
    ax0.legend(fontsize=6)
    return fig


def diagonal_heads(a: Analysis, control: Analysis | None = None) -> Figure:
    return _diagonal_heads([(label, c, nanmean(dh.diagonal, axis=0), dh.absorption.mean(axis=0))
                            for label, dh, c, _ in _pairs(a, control, "diagonal_heads", "diagonal")])


def _diagonal_heads(series) -> Figure:
    """series: [(label, colour, (L, H) mean diagonal share, (L, H) mean absorption)]."""
    fig, (ax,) = _fig(1, 6.0, 4.5)
    for label, c, diag, absorbed in series:
        ax.scatter(diag.ravel(), absorbed.ravel(), s=14, color=c, label=label, alpha=0.8)
    ax.axvline(HEAD_SHARE, color="k", lw=0.5)
    ax.axhline(HEAD_SHARE, color="k", lw=0.5)
    ax.set(xlabel="diagonal share Σ_i A[i,i] / Q", ylabel="absorption Σ_{j ∈ sinks} r_j / Σ r_j", xlim=(-0.02, 1.02),
           ylim=(-0.02, 1.02), title="diagonal (self) heads vs sink heads, one dot per head")
    ax.legend(fontsize=7)
    return fig


def distance(a: Analysis, control: Analysis | None = None) -> Figure:
    return _distance([(label, c, ls, *dp.profile())
                      for label, dp, c, ls in _pairs(a, control, "distance_profile", "distance")])


def _distance(series) -> Figure:
    """series: [(label, colour, style, (L, D) attention per query row by distance, (L, D) the uniform one)]."""
    fig, (ax,) = _fig(1, 7.0, 4.0)
    for label, c, ls, prof, uni in series:
        with np.errstate(all="ignore"):
            ratio = prof / np.where(uni > 0, uni, np.nan)
        ax.plot(nanmean(ratio, axis=0), color=c, ls=ls, label=f"{label} (mean over layers)")
    ax.axhline(1.0, color="k", lw=0.5)
    ax.set(xlabel="distance |i − j| (positions)", ylabel="attention / uniform attention\nat that distance",
           yscale="log", title="received attention vs distance")
    ax.yaxis.set_major_formatter(LogFormatter())
    ax.yaxis.set_minor_formatter(LogFormatter(minor_thresholds=(2, 0.5)))
    integer_ticks(ax, "x")
    ax.legend(fontsize=7)
    return fig


def logit_lens(a: Analysis, control: Analysis | None = None, rows: int = 14) -> Figure:
    """The lens as a grid: one row per (step, sink position), one column per lens layer; each cell
    names the lens' top token there, coloured by its probability (the first `rows` rows)."""
    lens = _need(a, "logit_lens", "lens_layers")
    layers = sorted({r["layer"] for r in lens})
    keys = list(dict.fromkeys((r["step"], r["position"]) for r in lens))[:rows]   # in the order recorded
    prob = np.full((len(keys), len(layers)), np.nan)
    text = [["" for _ in layers] for _ in keys]
    where = {k: i for i, k in enumerate(keys)}
    token_at = {}
    for r in lens:
        i = where.get((r["step"], r["position"]))
        if i is None or not r["top"]:
            continue
        j = layers.index(r["layer"])
        prob[i, j] = r["probs"][0]
        text[i][j] = _short(r["top"][0], 10) + f"\n{r['probs'][0]:.2f}"
        token_at[keys[i]] = r["token"]
    fig = NotebookFigure(figsize=(min(3.2 + 1.15 * len(layers), 14), 1.4 + 0.42 * len(keys)), layout="constrained")
    ax = fig.subplots()
    im = ax.imshow(prob, aspect="auto", cmap="Blues", vmin=0, vmax=1, interpolation="nearest")
    for i, row in enumerate(text):
        for j, t in enumerate(row):
            if t:
                ax.text(j, i, t, ha="center", va="center", fontsize=7, fontfamily="monospace",
                        color="white" if prob[i, j] > 0.6 else "black")
    ax.set_xticks(range(len(layers)), [str(l) for l in layers])
    ax.set_yticks(range(len(keys)), [f"step {s}, {p} {_short(token_at.get((s, p), ''), 10)}" for s, p in keys],
                  fontsize=7, fontfamily="monospace")
    ax.set_xlabel("lens layer (its output through the final norm and LM head)")
    ax.set_ylabel("sink position and its token")
    bar = fig.colorbar(im, ax=ax, label="probability of the top token")
    ax.set_title(f"{a.source.label}: logit lens at the sink positions\n({len(keys)} of "
                 f"{len(dict.fromkeys((r['step'], r['position']) for r in lens))} positions; every row in summary.json)",
                 fontsize=9)
    fit_colorbar_labels(fig, [bar])
    return fig


def _short(token, n: int) -> str:
    """A token as a tick or cell shows it: whitespace visible, at most n characters."""
    t = str(token).replace("\n", "↵").replace(" ", "␣").replace("Ġ", "␣").replace("▁", "␣").replace("$", r"\$") or "∅"
    return t if len(t) <= n else t[: n - 1] + "…"


FIGURES = {"readout_k_sigma": k_sigma, "readout_absorption": absorption, "readout_mask_ranking": mask_ranking,
           "readout_value_norms": value_norms, "readout_massive": massive, "readout_diagonal_heads": diagonal_heads,
           "readout_distance": distance, "readout_logit_lens": logit_lens}


# The same figures from a corpus run's totals (sinklens/analysis/corpus.py): `t` is one accumulator's
# summed part, {"sum", "n"} per mean, so each curve is a mean over every (prompt, step) of the corpus.

def _mean(total, count) -> np.ndarray:
    with np.errstate(all="ignore"):
        return np.where(count > 0, total / np.maximum(count, 1), np.nan)


def _corpus_needs(t: dict, keys: tuple[str, ...], readout: str) -> None:
    if any(k not in t for k in keys):
        raise AnalysisInputError(f"the corpus recorded no {readout} readout (trace it with --{readout.replace('_', '-')})")


# Each takes the corpus' totals and label and, optionally, the control corpus' (same accumulator):
# `runs` = [(label, totals)], the corpus first, the control (if any) second, drawn dashed / grey.

def _styled(runs: list[tuple[str, dict]]):
    return [(label, t, *style) for (label, t), style in zip(runs, ((TRAINED, "-"), (CONTROL, "--")))]


def corpus_value_norms(runs: list[tuple[str, dict]], units: str) -> Figure:
    for _, t in runs:
        _corpus_needs(t, ("value_norm_by_score", "value_norm_ratio"), "value_norms")
    return _value_norms([(label, c, ls, _mean(t["value_norm_by_score"]["sum"], t["value_norm_by_score"]["count"]),
                          value_norm_ratio(t)) for label, t, c, ls in _styled(runs)], units)


def value_norm_ratio(t: dict) -> np.ndarray:
    """(L,) ||v|| at sinks / at other keys per layer, over every (prompt, step, head) of the totals."""
    r = t["value_norm_ratio"]
    return _mean(np.asarray(r["sum"]).sum(-1), np.asarray(r["n"]).sum(-1))


def corpus_massive(runs: list[tuple[str, dict]], units: str) -> Figure:
    for _, t in runs:
        _corpus_needs(t, ("ratio", "sink_norm_ratio"), "hidden_norms")
    mean = lambda t, k: _mean(t[k]["sum"], t[k]["n"]) if k in t else np.full(np.shape(t["ratio"]["sum"]), np.nan)  # noqa: E731
    return _massive([(label, c, ls, mean(t, "ratio"), mean(t, "ratio_all"), mean(t, "sink_norm_ratio"))
                     for label, t, c, ls in _styled(runs)])


def corpus_diagonal_heads(runs: list[tuple[str, dict]], units: str) -> Figure:
    for _, t in runs:
        _corpus_needs(t, ("diagonal", "absorption"), "diagonal")
    return _diagonal_heads([(label, c, _mean(t["diagonal"]["sum"], t["diagonal"]["n"]),
                             _mean(t["absorption"]["sum"], t["absorption"]["n"])) for label, t, c, _ in _styled(runs)])


def corpus_distance(runs: list[tuple[str, dict]], units: str) -> Figure:
    for _, t in runs:
        _corpus_needs(t, ("attention", "uniform", "steps"), "distance")
    return _distance([(label, c, ls, t["attention"] / t["steps"], t["uniform"] / t["steps"])
                      for label, t, c, ls in _styled(runs)])


# accumulator name -> (file name, figure from its corpus totals), for `sinklens report CORPUS.jsonl`
CORPUS_FIGURES = {"sink_vectors": ("readout_value_norms", corpus_value_norms),
                  "massive_activations": ("readout_massive", corpus_massive),
                  "diagonal_heads": ("readout_diagonal_heads", corpus_diagonal_heads),
                  "distance_profile": ("readout_distance", corpus_distance)}
