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
    assert "masked at that step" in [t.get_text() for t in ax.get_legend().get_texts()]


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
