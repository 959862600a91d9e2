"""Every figure at paper size (its own figsize, 110 dpi, as `save` writes it): no text outside the
figure, whole-number ticks on layer / head / step axes, the logit lens drawn as a grid (not a
clipped table), Fig. 3's "≤ 1e-3 or negative" bin off the colour scale, the drift row a sentence.

The trace is tiny-dlm with every readout on and its random-init control (no download: the twins
ship with sinklens)."""
from __future__ import annotations

import re

import numpy as np
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg

from sinklens.analysis import analyze
from sinklens.report import figures as F
from sinklens.report import readouts as R


@pytest.fixture(scope="module")
def traced(tmp_path_factory):
    import torch

    import sinklens
    from sinklens.samplers.capture import CaptureOptions

    d = tmp_path_factory.mktemp("paper")
    capture = CaptureOptions(value_norms=True, qk_norms=True, diagonal=True, distance=True, hidden_norms=True,
                             lens_layers=[0, 3])
    for name, seed in (("trained", None), ("control", 1)):
        m = sinklens.load("tiny-dlm", random_init=seed) if seed is not None else sinklens.load("tiny-dlm")
        torch.manual_seed(0)
        m.generate(m.apply_chat_template("Tom has 3 apples and buys 4 more. How many?"), trace=str(d / f"{name}.arrow"),
                   capture=capture, steps=6, gen_length=12, block_length=12)
    return analyze(d / "trained.arrow"), analyze(d / "control.arrow")


def _drawn(fig):
    FigureCanvasAgg(fig).draw()
    return fig.canvas.get_renderer()


def _texts_inside(fig, name):
    r = _drawn(fig)
    page = fig.bbox
    texts = [fig._suptitle, fig._supxlabel, *fig.texts, *(t for lg in fig.legends for t in lg.get_texts())]
    for ax in fig.axes:     # titles, axis and colour-bar labels, notes, legends (tick labels: the layout's)
        texts += [ax.title, ax._left_title, ax._right_title, ax.xaxis.label, ax.yaxis.label, *ax.texts]
        texts += list(ax.get_legend().get_texts()) if ax.get_legend() else []
    texts = [t for t in texts if t is not None and t.get_visible() and t.get_text().strip()]
    for t in texts:
        box = t.get_window_extent(r)
        assert page.x0 - 0.5 <= box.x0 and box.x1 <= page.x1 + 0.5 and page.y0 - 0.5 <= box.y0 and \
            box.y1 <= page.y1 + 0.5, f"{name}: {t.get_text()!r} runs off the figure"
    return r


def _integer_axes(fig, name):
    for ax in fig.axes:
        for axis, label in ((ax.xaxis, ax.get_xlabel()), (ax.yaxis, ax.get_ylabel())):
            if re.match(r"(lens )?(layer|head|step|decoding step|denoising step)\b", label):   # an index axis
                lo, hi = sorted(axis.get_view_interval())
                ticks = [v for v in axis.get_majorticklocs() if lo - 1e-9 <= v <= hi + 1e-9]
                assert ticks and all(float(v).is_integer() for v in ticks), f"{name}: {label!r} ticks {ticks}"


@pytest.mark.parametrize("name", list(R.FIGURES))
def test_readout_figures_fit_and_count_in_whole_numbers(traced, name, tmp_path):
    a, control = traced
    fig = R.FIGURES[name](a, control)
    _texts_inside(fig, name)
    _integer_axes(fig, name)
    if name == "readout_logit_lens":
        assert not [c for ax in fig.axes for c in ax.get_children() if type(c).__name__ == "Table"]
        assert fig.axes[0].images                                   # a grid: layers × sink positions
    fig.savefig(tmp_path / f"{name}.png", dpi=110)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["fig01", "fig03", "fig05", "fig07", "fig10"])
def test_paper_figures_fit_and_count_in_whole_numbers(traced, name, tmp_path):
    a, _ = traced
    fig = {"fig01": lambda: F.received_over_steps(a), "fig03": lambda: F.score_distribution(a),
           "fig05": lambda: F.layer_head_scores(a), "fig07": lambda: F.sink_positions(a),
           "fig10": lambda: F.eps_sweep([a])}[name]()
    _texts_inside(fig, name)
    _integer_axes(fig, name)
    fig.savefig(tmp_path / f"{name}.png", dpi=110)


def test_fig3_low_bin_is_grey_and_off_the_colour_scale(traced):
    """Bin 0 (margins ≤ 1e-3 or negative) holds most cells: it was the brightest band."""
    a, _ = traced
    fig = F.score_distribution(a)
    ax = fig.axes[0]
    mesh = next(c for c in ax.collections if hasattr(c, "get_array") and c.get_array() is not None)
    values = np.ma.filled(np.ma.asarray(mesh.get_array(), float), np.nan).reshape(-1, a.num_steps)   # (bins, steps)
    assert np.isnan(values[0]).all()                                # bin 0 not coloured by the scale
    frac = a.margin_hist / a.margin_hist.sum(1, keepdims=True)
    assert mesh.norm.vmax == pytest.approx(frac[:, 1:][frac[:, 1:] > 0].max())   # the scale: the other bins
    assert frac[:, 0].min() > mesh.norm.vmax                        # (bin 0 would have topped it)
    assert any("≤ 1e-3 or negative (grey)" in t.get_text() for t in ax.texts)


def test_summary_drift_row_is_a_sentence(traced):
    a, _ = traced
    row = dict(a.summary_rows())["drift"]
    assert "moves" not in row.split()[0] and ("leftward" in row or row == "no move of the largest sink")
    assert "fraction_" not in row and "_positions" not in row
