"""The paper's figures from an `Analysis` (matplotlib, no pyplot state: safe in scripts and notebooks).

Every function returns a `matplotlib.figure.Figure` (a notebook displays it); `save(fig, stem)`
writes `stem.png` and `stem.svg`. Every figure names its units in an axis or colour-bar label.

| paper           | function                 |
|-----------------|--------------------------|
| Fig. 1          | `received_over_steps`    |
| Fig. 3 / 9      | `score_distribution`     |
| Fig. 4 / 6 / 8  | `attention_maps`         |
| Fig. 5          | `layer_head_scores`      |
| Fig. 7          | `sink_positions`         |
| Fig. 10         | `eps_sweep`              |
| Table 2         | `sink_token_table`       |
| (blocks)        | `block_sinks`            |
| (editing)       | `sinks_on_edited`        |

Layout rules every figure keeps (tests/test_figures_axes.py measures them): legends sit outside
the data axes, colour-bar labels fit inside the figure and their own bar's height, position
axes carry the tokens, and block-diffusion runs get their block boundaries drawn.
"""
from __future__ import annotations

import io
import math
import os
import textwrap
from pathlib import Path

import matplotlib
import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import ListedColormap, LogNorm
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.ticker import MaxNLocator

from sinklens.analysis.analyze import HIST_EDGES, QUANTILES, Analysis
from sinklens.analysis.blocks import block_dynamics, blocks, edited_sinks
from sinklens.rule.spec import UNITS
from sinklens.analysis.source import AnalysisInputError

FORMATS = ("png", "svg")


class NotebookFigure(Figure):
    """A matplotlib Figure that shows itself inline in Jupyter without pyplot: IPython renders any
    object with `_repr_png_`, and these figures never touch pyplot's global state."""

    def _repr_png_(self) -> bytes:
        buf = io.BytesIO()
        self.savefig(buf, format="png", dpi=100)
        return buf.getvalue()


def save(fig: Figure, stem: str | os.PathLike, formats=FORMATS, dpi: int = 110) -> list[Path]:
    """Write the figure as stem.png and stem.svg (creating the folder); returns the paths."""
    stem = Path(stem)
    stem.parent.mkdir(parents=True, exist_ok=True)
    out = []
    for ext in formats:
        path = stem.with_suffix("." + ext)
        with matplotlib.rc_context({"svg.fonttype": "none"}):   # SVG text stays text (searchable, editable)
            fig.savefig(path, dpi=dpi)          # every figure uses constrained layout: no "tight" re-layout
        out.append(path)
    return out


def _units(a: Analysis) -> str:
    return f"{UNITS[a.units].label} [units={a.units}]"


def _step_label(a: Analysis) -> str:
    return "decoding step index (0 = prefill)" if a.source.causal else "denoising step index"


def _head_name(head: int | None) -> str:
    return "mean over heads" if head is None else f"head {head}"


# ---- layout helpers ---------------------------------------------------------------------------
def _legend_below(fig: Figure, handles, labels) -> None:
    """The legend under the axes, outside every data area (constrained layout makes room)."""
    if handles:
        fig.legend(handles, labels, loc="outside lower center", ncols=min(len(handles), 3), fontsize=7,
                   frameon=False)


def _renderer(fig: Figure):
    if not isinstance(fig.canvas, FigureCanvasAgg):   # a bare Figure has no renderer to measure text with
        FigureCanvasAgg(fig)
    return fig.canvas.get_renderer()


def fit_colorbar_labels(fig: Figure, bars) -> None:
    """Wrap each colour-bar label onto as many lines as it needs to be no taller than its bar: a
    label longer than a short panel (an ARM's one-row prefill) was clipped at the figure's edge.
    One layout pass to measure (the bars' heights depend on the layout); 15 % slack covers the
    bars getting a little shorter once the wrapped labels take their width."""
    r = _renderer(fig)
    # a label's height needs no layout, its bar's does: skip the layout pass (~0.5 s) when every label
    # is shorter than its bar could become (its height before layout, less 0.8 in for the margins)
    before = fig.get_figheight() * fig.dpi
    if all(cb.ax.yaxis.label.get_window_extent(r).height <= cb.ax.get_position().height * before - 0.8 * fig.dpi
           for cb in bars):
        return
    fig.draw_without_rendering()                      # run the constrained layout, then measure
    for cb in bars:
        lab = cb.ax.yaxis.label
        tall, room = lab.get_window_extent(r).height, cb.ax.get_window_extent(r).height
        if tall <= room:
            continue
        text = lab.get_text().replace("\n", " ")
        lines = math.ceil(1.15 * tall / max(room, 1.0) * (lab.get_text().count("\n") + 1))
        lab.set_text(textwrap.fill(text, width=max(8, math.ceil(len(text) / lines)), break_long_words=False,
                                   break_on_hyphens=False))


def integer_ticks(ax, which: str = "xy") -> None:
    """Whole-number ticks on the axes named in `which` ("x", "y"): layers, heads, steps and
    distances are counts, never −0.5 or 2.5."""
    for w in which:
        (ax.xaxis if w == "x" else ax.yaxis).set_major_locator(MaxNLocator(integer=True))


def _block_lines(ax, a: Analysis, which: str, n: int | None = None) -> list:
    """Dotted lines at the start of every block (block diffusion: attention blocks from position 0,
    or LLaDA's generation blocks after the prompt); which = "x" or "y" = the position axis."""
    b = blocks(a.source.layout)
    if b is None:
        return []
    kind = f"attention block ({b.size})" if b.causal_attention else f"generation block ({b.size})"
    line = ax.axvline if which == "x" else ax.axhline
    out = []
    for k, p in enumerate(b.starts(a.tokens.shape[1] if n is None else n)):
        out.append(line(p - 0.5, color="0.55", lw=0.8, ls=":", zorder=1.5,
                        label=f"{kind} boundary" if k == 0 else "_nolegend_"))
    return out


# ---- token axes -------------------------------------------------------------------------------
MAX_TICK_LABELS = 48      # more positions than this: label every k-th one (the prompt boundary always)
_SHOW = str.maketrans({"Ġ": "␣", "▁": "␣", "Ċ": "↵", "ĉ": "⇥", "\n": "↵", "\t": "⇥", "$": r"\$"})


def position_tokens(a: Analysis, max_chars: int = 10) -> list[str]:
    """Token string at every position as the run settled it: the token at the last step where the
    position was not masked ("[M]" if it stayed masked); whitespace shown as ␣ ↵ ⇥."""
    S = a.tokens.shape[1]
    ids = np.full(S, -1, np.int64)
    for t in range(a.num_steps):                         # later steps overwrite earlier ones
        seen = (a.tokens[t] >= 0) & ~a.is_masked[t]
        ids[seen] = a.tokens[t][seen]
    known = np.unique(ids[ids >= 0])
    text = dict(zip(known.tolist(), a.source.decode(known.tolist()))) if known.size else {}
    out = []
    for i in ids.tolist():
        tok = "[M]" if i < 0 else str(text.get(i, i)).translate(_SHOW) or "∅"
        out.append(tok if len(tok) <= max_chars else tok[: max_chars - 1] + "…")
    return out


def tick_positions(n: int, keep=(), max_labels: int = MAX_TICK_LABELS) -> list[int]:
    """Positions to label on an axis of n positions: all when n ≤ max_labels, else every k-th,
    plus the positions in `keep` (e.g. the first answer token)."""
    k = max(1, int(np.ceil(n / max_labels)))
    return sorted(set(range(0, n, k)) | {int(p) for p in keep if 0 <= p < n})


def _prompt_length(a: Analysis) -> int | None:
    p = a.source.prompt_length
    return int(p) if p is not None and 0 < p < a.tokens.shape[1] else None


def _token_axis(ax, a: Analysis, which: str) -> None:
    """Label a position axis with "position token" (thinned) and draw the prompt | answer boundary."""
    toks = position_tokens(a)
    p = _prompt_length(a)
    ticks = tick_positions(len(toks), keep=[] if p is None else [p])
    labels = [f"{j} {toks[j]}" for j in ticks]
    if which == "x":
        ax.set_xticks(ticks, labels, rotation=90, fontsize=6, fontfamily="monospace")
    else:
        ax.set_yticks(ticks, labels, fontsize=6, fontfamily="monospace")
    if p is not None:
        line = ax.axvline if which == "x" else ax.axhline
        line(p - 0.5, color="white" if which == "x" else "0.3", lw=1.2, ls="--")
        line(p - 0.5, color="black" if which == "x" else "0.3", lw=0.6, ls="--", label=f"prompt | answer (position {p})")


def _log_norm(x: np.ndarray) -> LogNorm | None:
    """Log colour scale over the positive values, at most 4 decades deep."""
    pos = x[np.isfinite(x) & (x > 0)]
    return LogNorm(vmin=max(float(pos.min()), float(pos.max()) * 1e-4, 1e-6), vmax=float(pos.max())) if pos.size else None


def received_over_steps(a: Analysis, layer: int | None = None, head: int | None = None, *,
                        mark_sinks: bool = True) -> Figure:
    """Fig. 1: received attention of every token (x, labelled with its token) at every step (y) for
    one layer and head (head None = mean over heads; layer None = the strongest-sink head,
    `Analysis.strongest_sink_head`), log colour scale. Eq. 3 sinks circled, masked cells hatched,
    the prompt | answer boundary dashed. ARM traces: the prefill (many query rows) and the decoding
    steps (one row each) get separate panels and colour scales — their column sums differ by the
    number of rows summed."""
    if layer is None:
        layer, head = a.strongest_sink_head()
    x = a.score_slice(layer, head)                                       # (T, S)
    T, S = x.shape
    multi = a.n_queries > 1
    split = a.source.causal and multi.any() and (~multi).any()          # ARM: prefill vs decoding
    groups = [np.flatnonzero(multi), np.flatnonzero(~multi)] if split else [np.arange(T)]
    names = ["prefill", "decoding steps (one query row each)"] if split else [None]
    rows = [max(len(g), 2) for g in groups]
    ratios = [max(r, T / 6) for r in rows]
    if split:                   # the one-row prefill panel gets room for its colour bar's label
        ratios[0] = max(ratios[0], 0.45 * ratios[1])
    fig = NotebookFigure(figsize=(min(6 + S / 9, 18), min(3.6 + sum(rows) / 9 + 1.2 * (len(groups) - 1), 11)),
                 layout="constrained")
    axes = fig.subplots(len(groups), 1, squeeze=False, sharex=True, gridspec_kw={"height_ratios": ratios})[:, 0]
    s = a.sinks
    bars = []
    for ax, g, name in zip(axes, groups, names):
        xs = x[g]
        norm = _log_norm(xs)
        if norm is not None:          # exact zeros (underflow) at the floor colour; NaN (no such position) stays blank
            xs = np.where(np.isfinite(xs), np.maximum(xs, norm.vmin), np.nan)
        # nearest on the data, then colours: the same pixels as colouring first, without the
        # float64 RGBA copies of the whole output raster (~100 MB at 18 x 11 in, 110 dpi)
        im = ax.imshow(xs.astype(np.float32), aspect="auto", origin="upper", cmap="magma", norm=norm,
                       interpolation="nearest", interpolation_stage="data", extent=(-0.5, S - 0.5, g[-1] + 0.5, g[0] - 0.5))
        masked = a.is_masked[g].astype(float)
        if masked.any() and min(masked.shape) >= 2:      # contours need a 2 × 2 grid
            ax.contourf(np.arange(S), g, masked, levels=[0.5, 1.5], colors="none", hatches=["////"])
            ax.contour(np.arange(S), g, masked, levels=[0.5], colors="deepskyblue", linewidths=0.6)
        if mark_sinks:
            if head is None:
                t, p = np.nonzero(a.mean_head["largest_pos"][g, layer, None] == np.arange(S)[None])
                t = g[t]
            else:
                sel = (s["layer"] == layer) & (s["head"] == head) & np.isin(s["step"], g)
                t, p = s["step"][sel], s["pos"][sel]
            ax.scatter(p, t, s=12, facecolors="none", edgecolors="cyan", linewidths=0.8,
                       label=f"Eq. 3 sink (ε={a.config.sink_eps:g})")
        _block_lines(ax, a, "x")
        ax.set_ylabel(_step_label(a) if name is None else f"{name}\nstep index")
        if len(g) <= 3:
            ax.set_yticks(g)
        else:
            ax.yaxis.get_major_locator().set_params(integer=True)    # step indices are whole numbers
        bars.append(fig.colorbar(im, ax=ax, label=_units(a) if name is None else f"{name.split()[0]} [units={a.units}]",
                                 shrink=0.9))
        _token_axis(ax, a, "x")
    handles, labels = axes[0].get_legend_handles_labels()
    if a.is_masked.any():
        handles.append(Patch(facecolor="none", edgecolor="deepskyblue", hatch="////"))
        labels.append("masked at that step")
    _legend_below(fig, handles, labels)
    axes[-1].set_xlabel("token position j and its token (last unmasked state)")
    fig.suptitle(f"{a.source.label}: received attention, layer {layer}, {_head_name(head)}"
                 + (" (separate colour scales)" if split else ""))
    fit_colorbar_labels(fig, bars)
    return fig


def score_distribution(a: Analysis) -> Figure:
    """Fig. 3 / 9: distribution of the Eq. 3 margin (score_j − mean of the other tokens' scores)
    of every (layer, head, key) at each step, against ε — the quantity Eq. 3 thresholds. A
    histogram per step as a column (log-spaced bins, colour = fraction of cells), quantile lines."""
    h = a.margin_hist.astype(float)                                       # (T, B)
    frac = h / np.maximum(h.sum(axis=1, keepdims=True), 1)
    fig = NotebookFigure(figsize=(9, 4.5), layout="constrained")
    ax = fig.add_subplot()
    edges = np.concatenate([HIST_EDGES[1:2] / 10, HIST_EDGES[1:], HIST_EDGES[-1:] * 10])  # bin 0 drawn below 1e-3
    steps = np.arange(a.num_steps + 1) - 0.5
    # bin 0 (margins ≤ 1e-3, negatives included: most keys are below the mean) holds most cells; on the
    # colour scale it would be the brightest band and squash the bins that matter into the dark end, so
    # it is drawn in grey with its share written on it, and the colour scale covers the other bins only
    rest = np.where(frac > 0, frac, np.nan)
    rest[:, 0] = np.nan
    shown = rest[np.isfinite(rest)]
    im = ax.pcolormesh(steps, edges, rest.T, cmap="viridis",
                       norm=LogNorm(vmin=max(shown.min(), 1e-7), vmax=shown.max()) if shown.size else None)
    ax.axhspan(edges[0], edges[1], color="0.85", zorder=0.5, lw=0)
    for qi, q in enumerate(QUANTILES):
        ax.plot(np.arange(a.num_steps), np.where(a.margin_quantiles[:, qi] > 0, a.margin_quantiles[:, qi], np.nan),
                lw=1, label=f"{q * 100:g}th percentile" if q < 1 else "max")
    ax.axhline(a.config.sink_eps, color="red", ls=":", lw=1.2, label=f"ε = {a.config.sink_eps:g}: above = Eq. 3 sink")
    ax.set_yscale("log")
    used = np.flatnonzero(h.sum(axis=0))
    lo = edges[used[0]] if used.size else edges[0]
    hi = edges[used[-1] + 1] if used.size else edges[-1]
    top = float(np.nanmax(a.margin_quantiles)) if np.isfinite(a.margin_quantiles).any() else hi
    ax.set_ylim(lo, max(hi, a.config.sink_eps * 2, top * 1.5))    # the max line stays inside the axes
    ax.set_xlabel(_step_label(a))
    integer_ticks(ax, "x")
    ax.set_ylabel(f"Eq. 3 margin: score_j − mean of the others\n[units={a.units}]")
    low = 100 * frac[:, 0]
    share = f"{low.min():.0f}–{low.max():.0f} %" if np.ptp(low) >= 0.5 else f"{low.mean():.0f} %"
    ax.text(0.01, np.sqrt(edges[0] * edges[1]), f"≤ 1e-3 or negative (grey): {share} of the cells",
            transform=ax.get_yaxis_transform(), va="center", fontsize=7, color="0.2")
    ax.set_title(f"{a.source.label}: Eq. 3 margin per step (all layers, heads, keys) against ε")
    _legend_below(fig, *ax.get_legend_handles_labels())
    bar = fig.colorbar(im, ax=ax, label="fraction of (layer, head, key) cells in the bin")
    fit_colorbar_labels(fig, [bar])
    return fig


def attention_maps(a: Analysis, steps, layer: int, head: int) -> Figure:
    """Fig. 4 / 6 / 8: full attention maps A[i, j] of one (layer, head) at the given step indices
    (only when the trace stores them); masked query rows / key columns are outlined."""
    src = a.source
    src.check_layer_head(layer, head)
    if not src.map_slices():
        raise AnalysisInputError(src.no_maps_message())
    steps = list(np.atleast_1d(steps))
    for t in steps:
        src.check_index(int(t))
    maps = []
    for t in steps:
        try:
            maps.append(src.map(int(t), layer, head))
        except KeyError as e:
            raise AnalysisInputError(str(e).strip("'\"")) from None
    fig = NotebookFigure(figsize=(4.6 * len(maps) + 1.5, 5.4), layout="constrained")
    axes = fig.subplots(1, len(maps), squeeze=False)[0]
    vmax = max(float(m.max()) for m in maps)
    for ax, t, m in zip(axes, steps, maps):
        t = int(t)
        sq, sk = m.shape
        im = ax.imshow(np.where(m > 0, m, np.nan), cmap="magma", norm=LogNorm(vmin=max(vmax * 1e-4, 1e-6), vmax=vmax),
                       interpolation="nearest", interpolation_stage="data", aspect="auto")
        masked = np.flatnonzero(a.is_masked[t, :sk])
        if masked.size:
            ax.axvspan(masked[0] - 0.5, masked[-1] + 0.5, ymin=0, ymax=0.02, color="cyan")
        sel = (a.sinks["step"] == t) & (a.sinks["layer"] == layer) & (a.sinks["head"] == head)
        for p in a.sinks["pos"][sel]:
            ax.axvline(p, color="cyan", lw=0.6, ls="--")
        _block_lines(ax, a, "x", sk)
        ax.set_title(f"step {a.step_numbers[t]}")
        toks = step_tokens(a, t)
        kx = tick_positions(sk, max_labels=24)
        ax.set_xticks(kx, [f"{j} {toks[j]}" for j in kx], rotation=90, fontsize=6, fontfamily="monospace")
        # the query rows are the step's last sq positions (all of them on a DLM step; the newest on an
        # ARM decoding step; the active block on SDAR's)
        first = sk - sq
        ky = tick_positions(sq, max_labels=24)
        ax.set_yticks(ky, [f"{first + i} {toks[first + i]}" + ("\n(newest)" if sq == 1 else "") for i in ky],
                      fontsize=6, fontfamily="monospace")
        ax.set_xlabel("key position j and its token")
    axes[0].set_ylabel("query position i and its token")
    fig.supxlabel("dashed cyan: Eq. 3 sinks of this head; cyan bar: masked keys; dotted grey: block boundaries",
                  fontsize=8)
    fig.suptitle(f"{src.label}: attention map, layer {layer}, head {head}")
    bar = fig.colorbar(im, ax=list(axes), label="attention probability A[i, j] (rows sum to 1)")
    fit_colorbar_labels(fig, [bar])
    return fig


def step_tokens(a: Analysis, t: int, max_chars: int = 8) -> list[str]:
    """Token string at every position as fed to the model at step index t ("[M]" for a mask)."""
    ids = a.tokens[t][: int(a.seq_len[t])]
    known = np.unique(ids[ids >= 0])
    text = dict(zip(known.tolist(), a.source.decode(known.tolist()))) if known.size else {}
    out = []
    for i, masked in zip(ids.tolist(), a.is_masked[t][: ids.size].tolist()):
        tok = "[M]" if masked or i < 0 else str(text.get(i, i)).translate(_SHOW) or "∅"
        out.append(tok if len(tok) <= max_chars else tok[: max_chars - 1] + "…")
    return out


def layer_head_scores(a: Analysis) -> Figure:
    """Fig. 5: per layer × head, the largest sink's score averaged over the steps that have a sink
    (grey: never a sink) and the mean number of sinks per step."""
    st = a.layer_head_stats()
    fig = NotebookFigure(figsize=(min(8 + a.num_heads * 0.35, 20), min(3.5 + a.num_layers * 0.22, 12)), layout="constrained")
    ax1, ax2 = fig.subplots(1, 2)
    cm = matplotlib.colormaps["viridis"].with_extremes(bad="lightgrey")
    im = ax1.imshow(st["largest_sink_score_mean"], aspect="auto", cmap=cm, interpolation="nearest")
    bars = [fig.colorbar(im, ax=ax1, label=f"largest-sink score, mean over steps [units={a.units}]")]
    ax1.set_title("sink score (grey: no sink)")
    im2 = ax2.imshow(st["sink_count_mean"], aspect="auto", cmap="Blues", interpolation="nearest")
    bars.append(fig.colorbar(im2, ax=ax2, label="sinks per step (count, mean over steps)"))
    ax2.set_title(f"number of sinks (ε = {a.config.sink_eps:g})")
    for ax in (ax1, ax2):
        ax.set_xlabel("head")
        ax.set_ylabel("layer")
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.yaxis.get_major_locator().set_params(integer=True)
    fig.suptitle(f"{a.source.label}: sinks per layer × head")
    fig.supxlabel(f"units={a.units}: {a.units_short}", fontsize=8)    # the long meaning, once, below
    fit_colorbar_labels(fig, bars)
    return fig


def sink_positions(a: Analysis, heads=None, *, show_frontier: bool = True) -> Figure:
    """Fig. 7: position of the largest Eq. 3 sink at each step for the chosen (layer, head) pairs
    (None in place of a head = mean over heads); gaps where the head has no sink. The masked
    region (unmasking frontier) is shaded."""
    heads = heads or a.pick_heads()
    if not all(isinstance(p, (tuple, list)) and len(p) == 2 for p in heads):
        raise AnalysisInputError(f"heads must be (layer, head) pairs, e.g. [(1, 3), (2, None)], got {heads!r}")
    for l, h in heads:
        a.source.check_layer_head(l, h)
    fig = NotebookFigure(figsize=(9, min(4 + a.tokens.shape[1] / 40, 9)), layout="constrained")
    ax = fig.add_subplot()
    T, S = a.tokens.shape
    t = np.arange(T)
    handles = []
    if show_frontier and a.is_masked.any():
        # exactly the masked (step, position) cells, under everything: Dream unmasks anywhere, so
        # a leftmost..rightmost span shaded nearly the whole answer, over unmasked tokens too
        cells = np.where(a.is_masked.T, 1.0, np.nan)                                 # (S, T)
        ax.pcolormesh(np.arange(T + 1) - 0.5, np.arange(S + 1) - 0.5, cells, cmap=ListedColormap(["0.88"]),
                      zorder=0, rasterized=True)
        handles.append(Patch(facecolor="0.88", label="masked at that step"))
    markers, sizes = "os^Dv<>p", (6.5, 5, 3.5)
    for k, (l, h) in enumerate(heads):
        p = (a.largest_pos[:, l, h] if h is not None else a.mean_head["largest_pos"][:, l]).astype(float)
        p[p < 0] = np.nan
        # each head its own marker and a smaller size than the one before: a head whose sink sits where
        # another's does stays visible inside it
        line, = ax.plot(t, p, marker=markers[k % len(markers)], ms=sizes[min(k, len(sizes) - 1)], lw=1,
                        mfc="none" if k == 0 else None, zorder=3 + k, label=f"layer {l}, {_head_name(h)}")
        handles.append(line)
    ax.set_xlabel(_step_label(a))
    ax.set_xlim(-0.5, a.num_steps - 0.5)              # every step, even when only some have a sink
    integer_ticks(ax, "x")
    ax.set_ylabel("position of the largest sink and its token")
    ax.set_ylim(S - 0.5, -0.5)                        # position 0 on top, as on Fig. 1's rows of tokens
    _token_axis(ax, a, "y")
    _block_lines(ax, a, "y")
    ax.set_title(f"{a.source.label}: largest sink position (Eq. 3, ε = {a.config.sink_eps:g}, units={a.units})")
    handles += [h for h in ax.get_lines() if not h.get_label().startswith("_") and h not in handles]
    ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    return fig


def block_sinks(a: Analysis) -> Figure:
    """Sink dynamics across blocks (block diffusion): per block, the Eq. 3 sinks (layer, head,
    position) at its last step split by where they sit (prompt, earlier blocks, its own block),
    and per pair of consecutive blocks how many persist, appear and vanish
    (sinklens/analysis/blocks.py)."""
    d = block_dynamics(a)
    if d is None:
        raise AnalysisInputError(f"trace '{a.source.label}' has no blocks (no attention_block or block_length in "
                                 "its layout): nothing to draw across blocks")
    fig = NotebookFigure(figsize=(min(max(10, 2 + 1.1 * len(d.blocks)), 20), 4.6), layout="constrained")
    ax1, ax2 = fig.subplots(1, 2)
    x = np.arange(len(d.blocks))
    bottom = np.zeros(len(d.blocks))
    for vals, name, colour in ((d.in_prompt, "on prompt positions", "0.6"), (d.in_earlier, "on earlier blocks", "tab:blue"),
                               (d.in_own, "on its own block", "tab:purple")):
        ax1.bar(x, vals, bottom=bottom, color=colour, label=name)
        bottom += np.asarray(vals)
    ax1.set_xticks(x, [f"{b}\n{a.step_numbers[f]}–{a.step_numbers[l]}" for b, f, l in
                       zip(d.blocks, d.first_step, d.last_step)], fontsize=7)
    ax1.set_xlabel("block (in the order it was denoised)\nand its steps")
    ax1.set_ylabel("Eq. 3 sinks at the block's last step\n(layer, head, position)")
    ax1.set_title("where each block's sinks sit")
    pairs = [f"{b}→{c}" for b, c in zip(d.blocks[:-1], d.blocks[1:])]
    xp = np.arange(len(pairs))
    for k, (vals, name, colour) in enumerate(((d.persist, "persist", "tab:green"), (d.new, "new", "tab:orange"),
                                              (d.gone, "gone", "tab:red"))):
        ax2.bar(xp + (k - 1) * 0.27, vals, width=0.27, color=colour, label=name)
    ax2.set_xticks(xp, pairs, fontsize=7)
    ax2.set_xlabel("consecutive blocks")
    ax2.set_ylabel("sinks (layer, head, position)")
    ax2.set_title("sinks carried from one block to the next")
    h1, l1 = ax1.get_legend_handles_labels()
    h2, l2 = ax2.get_legend_handles_labels()
    _legend_below(fig, h1 + h2, l1 + l2)
    for ax in (ax1, ax2):
        ax.yaxis.get_major_locator().set_params(integer=True)
    b = blocks(a.source.layout)
    kind = "attention blocks" if b.causal_attention else "generation blocks"
    fig.suptitle(f"{a.source.label}: sinks across {kind} of {b.size} (ε = {a.config.sink_eps:g}, units={a.units})")
    return fig


def sinks_on_edited(a: Analysis) -> Figure:
    """Sinks on edited tokens (an editing sampler, LLaDA2.1): per (step, position) the number of
    (layer, head) with an Eq. 3 sink there; cells whose token was rewritten at that step crossed,
    positions holding a rewritten token (edited then or earlier) outlined in green."""
    e = edited_sinks(a)
    if e is None:
        raise AnalysisInputError(f"trace '{a.source.label}' records no edits (its sampler never rewrites a token)")
    T, S = e.sink_heads.shape
    fig = NotebookFigure(figsize=(min(6 + S / 9, 18), min(3.6 + T / 9, 11)), layout="constrained")
    ax = fig.add_subplot()
    counts = np.where(a.key_mask[:, :S], e.sink_heads, np.nan).astype(float)
    cm = matplotlib.colormaps["Blues"].with_extremes(bad="white")
    im = ax.imshow(counts, aspect="auto", cmap=cm, interpolation="nearest", vmin=0,
                   vmax=max(1, int(e.sink_heads.max())))
    if T >= 2 and S >= 2 and e.edited_before.any():      # contours need a 2 × 2 grid
        ax.contour(np.arange(S), np.arange(T), e.edited_before.astype(float), levels=[0.5], colors="tab:green",
                   linewidths=1.0)
    tt, jj = np.nonzero(e.edited_at)
    ax.scatter(jj, tt, marker="x", s=18, color="tab:red", linewidths=0.9, zorder=3, label="rewritten at that step")
    on = (e.sink_heads > 0) & e.edited_before
    ts, js = np.nonzero(on)
    ax.scatter(js, ts, marker="o", s=40, facecolors="none", edgecolors="tab:green", linewidths=1.2, zorder=4,
               label="sink on an edited token")
    _token_axis(ax, a, "x")
    _block_lines(ax, a, "x")
    ax.set_ylabel(_step_label(a))
    ax.yaxis.get_major_locator().set_params(integer=True)
    ax.set_xlabel("token position j and its token (last unmasked state)")
    handles, labels = ax.get_legend_handles_labels()
    handles.append(Patch(facecolor="none", edgecolor="tab:green"))
    labels.append("holds an edited token (green outline)")
    _legend_below(fig, handles, labels)
    bar = fig.colorbar(im, ax=ax, label="(layer, head) with an Eq. 3 sink here (count)")
    fig.suptitle(f"{a.source.label}: sinks on edited tokens — {int(e.on_edited.sum())} (step, layer, head) sinks "
                 f"on edited tokens, {len(e.positions)} positions edited (ε = {a.config.sink_eps:g}, units={a.units})")
    fit_colorbar_labels(fig, [bar])
    return fig


def eps_sweep(analyses, labels=None) -> Figure:
    """Fig. 10: % of real tokens flagged by Eq. 3 as ε grows, one curve per analysis (compare
    several traces); the default ε is marked."""
    analyses = [analyses] if isinstance(analyses, Analysis) else list(analyses)
    labels = labels or [a.source.label for a in analyses]
    units = {a.units for a in analyses}
    if len(units) > 1:
        raise ValueError(f"eps_sweep compares analyses in one unit; got {sorted(units)}")
    fig = NotebookFigure(figsize=(6, 4), layout="constrained")
    ax = fig.add_subplot()
    eps0 = analyses[0].config.sink_eps
    for a, lab in zip(analyses, labels):
        sw = a.eps_sweep
        at = np.interp(eps0, sw.eps, 100 * sw.fraction)
        ax.plot(sw.eps, 100 * sw.fraction, marker=".", label=f"{lab} ({at:.2g} % at ε = {eps0:g})")
    ax.axvline(eps0, color="red", ls=":", lw=1)
    ax.set_ylim(bottom=0)
    u = units.pop()
    ax.set_xlabel(f"ε (Eq. 3 threshold) [units={u}]\n" + textwrap.fill(UNITS[u].label, 64), fontsize=9)
    ax.set_ylabel("% of tokens flagged as sinks")
    ax.set_title("ε sweep: fraction of (step, layer, head, key) cells flagged")
    ax.legend(fontsize=7)
    return fig


def sink_token_table(a: Analysis, out_stem: str | os.PathLike | None = None, top: int = 20) -> str:
    """Table 2: sink occurrences per token and per category; writes stem.csv and stem.md when
    `out_stem` is given; returns the markdown."""
    md = a.token_table.to_markdown(top)
    if out_stem is not None:
        stem = Path(out_stem)
        stem.parent.mkdir(parents=True, exist_ok=True)
        stem.with_suffix(".csv").write_text(a.token_table.to_csv(), encoding="utf-8")
        stem.with_suffix(".md").write_text(md, encoding="utf-8")
    return md
