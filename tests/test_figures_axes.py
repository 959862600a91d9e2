"""What the figures show beyond the numbers: tokens on position axes, the prompt | answer boundary,
the masked overlay, Fig. 3 on the Eq. 3 margin, separate ARM colour scales, the default head.

Ground truth is the planted trace (tests/_planted.py) and Eq. 3 recomputed here from its column
sums, not the analysis code under test.
"""
import numpy as np
import pytest
from matplotlib.colors import LogNorm

import _planted as P
from sinklens.analysis import analyze
from sinklens.report import figures as F
from sinklens.report.report import ReportOptions, build_report


@pytest.fixture(scope="module")
def planted():
    return analyze(P.source())


def _eq3(received: np.ndarray) -> np.ndarray:
    """(…, S) Eq. 3 margins: score_j minus the mean of the other tokens' scores."""
    s = received.shape[-1]
    return received - (received.sum(-1, keepdims=True) - received) / (s - 1)


def test_fig1_token_axis_boundary_and_masked_overlay(planted):
    fig = F.received_over_steps(planted, 0, 1)
    ax = fig.axes[0]
    labels = [t.get_text() for t in ax.get_xticklabels()]
    assert len(labels) == P.S                                      # 32 positions: every one labelled
    assert labels[10] == "10 the" and labels[3] == "3 ␣" and labels[31] == "31 ↵"
    assert labels[P.S - 1].startswith("31")
    bounds = [l for l in ax.get_lines() if l.get_label().startswith("prompt | answer")]
    assert bounds and bounds[0].get_xdata()[0] == P.PROMPT - 0.5
    hatched = [c for c in ax.collections if any(getattr(c, "hatches", None) or [])]
    assert hatched                                                 # masked cells are drawn over
    assert "masked at that step" in [t.get_text() for t in fig.legends[0].get_texts()]   # below the axes


def test_position_tokens_take_the_last_unmasked_state(planted):
    toks = F.position_tokens(planted, max_chars=99)
    base = P.base_tokens()
    assert toks == [P.VOCAB[int(i)].replace("Ġ", "␣").replace("Ċ", "↵") for i in base]   # all revealed by step 5
    assert F.position_tokens(planted)[0] == "<|startof…"                  # long tokens cut to 10 characters


def test_long_axes_are_thinned_and_keep_the_boundary():
    ticks = F.tick_positions(300, keep=[123])
    assert len(ticks) <= F.MAX_TICK_LABELS + 1 and 123 in ticks and 0 in ticks
    assert F.tick_positions(20) == list(range(20))


def test_fig7_tokens_on_the_position_axis(planted):
    fig = F.sink_positions(planted, [(0, 1)])
    ax = fig.axes[0]
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert "10 the" in labels and "20 ," in labels
    assert ax.get_xlim() == (-0.5, P.T - 0.5)


def test_fig3_is_the_eq3_margin_against_eps(planted):
    margins = _eq3(P.build()["received"])                           # (T, L, H, S), no padding in the plant
    for t in range(P.T):
        m = margins[t].ravel()
        assert planted.margin_hist[t].sum() == m.size
        assert planted.margin_hist[t][0] == int((m < 1e-3).sum())    # negatives and tiny margins: bin 0
        assert np.isclose(planted.margin_quantiles[t, -1], m.max(), rtol=1e-5)
    fig = F.score_distribution(planted)
    ax = fig.axes[0]
    assert "margin" in ax.get_ylabel()
    eps = [l for l in ax.get_lines() if l.get_label().startswith("ε = 3")]
    assert eps and eps[0].get_ydata()[0] == 3.0
    maxline = next(l for l in ax.get_lines() if l.get_label() == "max")
    assert np.allclose(maxline.get_ydata(), planted.margin_quantiles[:, -1])


def test_arm_prefill_and_decoding_have_their_own_colour_scales():
    a = analyze(P.arm_source(), units="sum")           # raw sums: 8 rows summed vs one
    fig = F.received_over_steps(a, 0, 0)
    images = [ax.images[0] for ax in fig.axes if ax.images]
    assert len(images) == 2                                         # prefill panel, decoding panel
    x = a.score_slice(0, 0)
    for im, rows in zip(images, (slice(0, 1), slice(1, None))):
        assert isinstance(im.norm, LogNorm)
        assert np.isclose(im.norm.vmax, np.nanmax(x[rows]), rtol=1e-6)
    assert images[0].norm.vmax > 3 * images[1].norm.vmax          # 8 rows summed vs one


@pytest.mark.slow
def test_default_single_head_is_the_strongest_sink(planted, tmp_path):
    margins = _eq3(P.build()["received"])                           # (T, L, H, S)
    rec = P.build()["received"]
    best = np.where(margins >= 3.0, rec, -np.inf).max(-1)           # (T, L, H) largest sink's score
    strength = np.where(np.isfinite(best), best, 0.0).mean(0)       # (L, H)
    expected = tuple(int(i) for i in np.unravel_index(np.argmax(strength), strength.shape))
    assert planted.strongest_sink_head() == expected
    fig = F.received_over_steps(planted)                            # no layer given: that head
    assert f"layer {expected[0]}, head {expected[1]}" in fig.get_suptitle()
    rep = build_report([P.source()], tmp_path / "r", options=ReportOptions(progress=False))
    assert f"fig01_received_layer{expected[0]}_head{expected[1]}" in rep.traces[0].figures


# ---- layout: what a reader sees at paper size (geometry measured on the drawn figure) ------------
def _extents(fig):
    """Draw the figure (constrained layout runs) and return a function giving an artist's window
    extent in pixels."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    r = canvas.get_renderer()
    return lambda artist: artist.get_window_extent(r)


def _data_axes(fig):
    """Axes that show data: not the colour bars."""
    bars = {id(im.colorbar.ax) for ax in fig.axes for im in ax.images + ax.collections
            if getattr(im, "colorbar", None) is not None}
    return [ax for ax in fig.axes if id(ax) not in bars]


def _legends(fig):
    return list(fig.legends) + [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None]


def _keep(fig, tmp_path, name):
    """Save what was measured as a PNG in the test's own output, to look at."""
    fig.savefig(tmp_path / f"{name}.png", dpi=110)


@pytest.mark.slow
@pytest.mark.parametrize("make", ["fig1", "fig3"])
def test_legends_sit_outside_the_data(planted, make, tmp_path):
    fig = F.received_over_steps(planted, 0, 1) if make == "fig1" else F.score_distribution(planted)
    ext = _extents(fig)
    legends = _legends(fig)
    assert legends
    for lg in legends:
        box = ext(lg)
        for ax in _data_axes(fig):
            assert not box.overlaps(ext(ax)), f"{make}: legend over the data of {ax.get_title() or ax.get_ylabel()}"
    _keep(fig, tmp_path, make)


def _bar_labels(fig):
    return [ax.yaxis.label for ax in fig.axes if ax not in _data_axes(fig) and ax.yaxis.label.get_text()]


def _arm(decode_steps: int, prompt: int):
    """Causal: a prefill step over `prompt` rows, then one query row per decoding step."""
    from sinklens.analysis import ArraySource

    rng = np.random.default_rng(0)
    T = decode_steps + 1
    S = prompt + decode_steps
    received = np.zeros((T, 1, 2, S), np.float32)
    tokens = np.full((T, S), -1)
    qpos = []
    for t in range(T):
        n = prompt + t
        A = rng.dirichlet(np.full(n, 0.3), size=n if t == 0 else 1)          # rows of attention over n keys
        received[t, 0, :, :n] = A.sum(0)
        tokens[t, :n] = np.arange(n) % 7
        qpos.append(np.arange(n) if t == 0 else np.array([n - 1]))
    key_mask = tokens >= 0
    return ArraySource(received, np.where(key_mask, tokens, 0), key_mask=key_mask, query_positions=qpos, causal=True,
                       vocab={i: f"t{i}" for i in range(7)}, prompt_length=prompt, label="arm")


@pytest.mark.slow
def test_arm_colour_bar_labels_fit_inside_the_figure(tmp_path):
    """ARM Fig. 1: the one-row prefill panel's colour-bar label was clipped at the figure's top."""
    a = analyze(_arm(decode_steps=10, prompt=18))                  # the shape of a tiny-arm trace, default units
    fig = F.received_over_steps(a, 0, 0)
    ext = _extents(fig)
    page = fig.bbox
    labels = _bar_labels(fig)
    assert len(labels) == 2                                          # prefill and decoding colour bars
    for lab in labels:
        box = ext(lab)
        assert page.x0 <= box.x0 and box.x1 <= page.x1 and page.y0 <= box.y0 and box.y1 <= page.y1, lab.get_text()
        assert "units=scaled_sum" in lab.get_text().replace("\n", "")   # wrapped, not cut: the units stay whole
    assert not ext(labels[0]).overlaps(ext(labels[1]))
    _keep(fig, tmp_path, "arm_fig1")


def test_fig5_colour_bar_label_stays_in_its_panel(planted, tmp_path):
    """Fig. 5: the left colour bar's label ran off the figure and into the right-hand panel."""
    fig = F.layer_head_scores(planted)
    ext = _extents(fig)
    left, right = _data_axes(fig)
    r = fig.canvas.get_renderer()
    page = fig.bbox
    for lab in _bar_labels(fig):
        box = ext(lab)
        assert page.x0 <= box.x0 and box.x1 <= page.x1 and page.y0 <= box.y0 and box.y1 <= page.y1, lab.get_text()
    first = ext(_bar_labels(fig)[0])
    assert first.x1 <= right.get_tightbbox(r).x0                     # left of the next panel's tick labels
    title = ext(fig._suptitle)
    assert not first.overlaps(title)
    _keep(fig, tmp_path, "fig5")


def test_fig7_shades_exactly_the_masked_cells_under_the_traces(tmp_path):
    """Dream unmasks anywhere: a leftmost..rightmost span shaded unmasked tokens and hid the traces.
    The shading is the masked (step, position) cells, drawn under every trace."""
    rng = np.random.default_rng(1)
    d = P.build(with_maps=False)
    T, S = d["is_masked"].shape
    masked = np.zeros((T, S), bool)
    for t in range(T):                                               # scattered masks, Dream-like
        masked[t, P.PROMPT:] = rng.random(S - P.PROMPT) < (1 - t / T)
    from sinklens.analysis import ArraySource

    a = analyze(ArraySource(d["received"], d["tokens"], is_masked=masked, vocab=P.VOCAB, prompt_length=P.PROMPT,
                            label="scattered"))
    fig = F.sink_positions(a, [(0, 1), (1, 0)])
    ax = fig.axes[0]
    meshes = [c for c in ax.collections if hasattr(c, "get_array") and c.get_array() is not None]
    assert len(meshes) == 1
    shaded = ~np.ma.getmaskarray(meshes[0].get_array()) & np.isfinite(np.ma.filled(meshes[0].get_array(), np.nan))
    np.testing.assert_array_equal(shaded.reshape(S, T), masked.T)    # (position, step) cells, nothing in between
    traces = [l for l in ax.get_lines() if l.get_label().startswith("layer")]
    assert len(traces) == 2 and all(meshes[0].get_zorder() < l.get_zorder() for l in traces)
    assert len({l.get_marker() for l in traces}) == 2                 # overlapping traces stay told apart
    _keep(fig, tmp_path, "fig7_scattered")


def test_attention_maps_label_their_tokens(planted, tmp_path):
    fig = F.attention_maps(planted, [0, 3], 1, 0)
    toks = F.step_tokens(planted, 3)
    ax = fig.axes[1]                                                 # step 3: some positions still masked
    x = {int(t.get_text().split()[0]): t.get_text() for t in ax.get_xticklabels()}   # position -> label
    y = {int(t.get_text().split()[0]): t.get_text() for t in ax.get_yticklabels()}
    assert x[10] == y[10] == "10 the" and toks[10] == "the"
    masked = [int(j) for j in np.flatnonzero(planted.is_masked[3]) if int(j) in x]
    assert masked and all(x[j] == f"{j} [M]" for j in masked)       # the token fed at that step
    assert "token" in ax.get_xlabel() and "token" in fig.axes[0].get_ylabel()
    _keep(fig, tmp_path, "fig4")
