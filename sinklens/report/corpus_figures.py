"""The figures a corpus run's totals can draw (sinklens/report/corpus.py), each with the random-init
control beside the corpus on the same scale when one is given.

| figure                    | function             |
|---------------------------|----------------------|
| Fig. 5 (corpus)           | `layer_head`         |
| Fig. 3 / 9 (corpus)       | `score_distribution` |
| Fig. 10 (corpus)          | `eps_sweep`          |

A view is one units view of `Corpus.to_dict()["views"]`; `runs` = [(label, view)], the corpus
first, its control (if any) second.
"""
from __future__ import annotations

import textwrap

import matplotlib
import numpy as np
from matplotlib.figure import Figure

from sinklens.report.figures import NotebookFigure, fit_colorbar_labels, integer_ticks
from sinklens.report.readouts import CONTROL, TRAINED
from sinklens.rule.spec import UNITS


def _units_label(units: str) -> str:
    return textwrap.fill(f"{UNITS[units].label if units in UNITS else units} [units={units}]", 64)


def layer_head(runs: list[tuple[str, dict]]) -> Figure:
    """Sink rate and sinks per step per layer × head over the whole corpus; the control's row below
    on the same colour scales (an all-zero control is drawn as zero, the scale's lowest colour)."""
    L, H = np.asarray(runs[0][1]["layer_head"]["sink_rate"]).shape
    n = len(runs)
    fig = NotebookFigure(figsize=(min(8 + H * 0.35, 20), min(1.6 + n * (1.9 + L * 0.2), 13)), layout="constrained")
    axes = np.atleast_2d(fig.subplots(n, 2, squeeze=False))
    counts = [np.asarray(v["layer_head"]["sinks_per_step"], float) for _, v in runs]
    top = max(float(np.nanmax(c)) if np.isfinite(c).any() else 0.0 for c in counts)
    grey = matplotlib.colormaps["Blues"].with_extremes(bad="lightgrey")
    for row, ((label, view), count) in enumerate(zip(runs, counts)):
        rate = np.asarray(view["layer_head"]["sink_rate"], float)
        im1 = axes[row, 0].imshow(rate, aspect="auto", cmap="viridis", vmin=0, vmax=1, interpolation="nearest")
        im2 = axes[row, 1].imshow(count, aspect="auto", cmap=grey, vmin=0, vmax=top if top > 0 else 1,
                                  interpolation="nearest")
        axes[row, 0].set_title(f"{label}: sink rate", fontsize=9)
        axes[row, 1].set_title(f"{label}: sinks per step", fontsize=9)
    bars = [fig.colorbar(im1, ax=list(axes[:, 0]), label="share of (prompt, step) pairs with an Eq. 3 sink"),
            fig.colorbar(im2, ax=list(axes[:, 1]), label="sinks per step (count, mean over prompts × steps)")]
    for ax in axes.ravel():
        ax.set_xlabel("head")
        ax.set_ylabel("layer")
        integer_ticks(ax, "xy")
    v = runs[0][1]
    fig.suptitle(f"sinks per layer × head over {v['prompts']} prompts, {v['steps']} steps [units={v['units']}]")
    fit_colorbar_labels(fig, bars)
    return fig


def score_distribution(runs: list[tuple[str, dict]]) -> Figure:
    """Counts of every (prompt, step, layer, head, key) score per bin; the control as a grey outline."""
    fig = NotebookFigure(figsize=(6.4, 4.2), layout="constrained")
    ax = fig.add_subplot()
    for k, (label, view) in enumerate(runs):
        d = view["score_distribution"]
        edges, counts = np.asarray(d["bin_edges"], float), np.asarray(d["counts"], float)
        left = edges.copy()
        left[0] = edges[1] / 10                      # bin 0 (below the first edge, zeros too) drawn one decade wide
        right = np.append(edges[1:], edges[-1] * 10)
        if k == 0:
            ax.bar(left, counts, width=right - left, align="edge", color=TRAINED, label=label)
        else:
            ax.stairs(counts, np.append(left, right[-1]), color=CONTROL, lw=1.5, ls="--", label=f"{label} (control)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel(_units_label(runs[0][1]["units"]) + "\n(the first bar: all values < 1e-3)", fontsize=9)
    ax.set_ylabel("(prompt, step, layer, head, key) count")
    ax.set_title("score distribution over the corpus")
    if len(runs) > 1:
        ax.legend(fontsize=7)
    return fig


def eps_sweep(runs: list[tuple[str, dict]], eps0: float) -> Figure:
    """Share of keys flagged as ε grows; the control dashed."""
    fig = NotebookFigure(figsize=(6.4, 4.2), layout="constrained")
    ax = fig.add_subplot()
    for (name, v), (c, ls) in zip(runs, ((TRAINED, "-"), (CONTROL, "--"))):
        sw = v["eps_sweep"]
        eps, frac = np.asarray(sw["eps"], float), 100 * np.asarray(sw["fraction_flagged"], float)
        ax.plot(eps, frac, marker=".", color=c, ls=ls, label=f"{name} ({np.interp(eps0, eps, frac):.2g} % at ε = {eps0:g})")
    ax.axvline(eps0, color="red", ls=":", lw=1)
    ax.set_ylim(bottom=0)
    ax.set_xlabel("ε (Eq. 3 threshold) in " + _units_label(runs[0][1]["units"]), fontsize=9)
    ax.set_ylabel("% of keys flagged as sinks")
    ax.set_title("ε sweep over the corpus")
    ax.legend(fontsize=7)
    return fig
