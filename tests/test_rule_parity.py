"""The sink rule's one implementation (rule/np_rule.py: the analysis of saved traces, sink masking
and the logit lens' sink positions all call it) against a brute-force reference built from a
dense (Q, S) visibility matrix — for causal and sliding layers the matrix comes from transformers'
own mask functions, which nobody here wrote."""
from __future__ import annotations

import numpy as np
import pytest
from transformers import masking_utils as mu

from sinklens.rule import np_rule
from sinklens.rule.spec import DEFAULT_EPS, UNITS, Visibility, layer_visibilities

S = 24


def dense_visibility(q: np.ndarray, real: np.ndarray, vis: Visibility) -> np.ndarray:
    """(Q, S) bool: may the query at q[k] see key j? Written from each layout's definition."""
    Q = len(q)
    ok = np.zeros((Q, S), bool)
    for a, i in enumerate(q):
        for j in range(S):
            # transformers' mask functions where a layout has one: (batch, head, q_idx, kv_idx)
            see = bool(mu.causal_mask_function(0, 0, i, j)) if vis.causal else True
            if vis.block:
                see &= j // vis.block <= i // vis.block
            if vis.window and vis.window_kind == "causal":
                see &= bool(mu.sliding_window_overlay(vis.window)(0, 0, i, j))
            if vis.window and vis.window_kind == "symmetric":
                see &= bool(mu.sliding_window_bidirectional_overlay(vis.window)(0, 0, i, j))
            if vis.window and vis.window_kind == "cache":   # the last window - 1 keys before the first query
                see &= j >= q.min() - (vis.window - 1)
            ok[a, j] = see and real[j]
    return ok


def brute(q, real, vis):
    """seen (S,), expected (S,), Q from the dense matrix."""
    ok = dense_visibility(q, real, vis)
    rows = ok.sum(1)
    w = np.where(rows > 0, 1.0 / np.maximum(rows, 1), 0.0)
    return ok.sum(0).astype(float), (ok * w[:, None]).sum(0), int((rows > 0).sum())


PAD = np.r_[np.zeros(3, bool), np.ones(S - 3, bool)]          # left padding
REAL = np.ones(S, bool)
LAYOUTS = {
    # name: (visibility, query positions, real keys)
    "bidirectional": (Visibility(), np.arange(S), REAL),
    "bidirectional-padded": (Visibility(), np.arange(3, S), PAD),
    "causal": (Visibility(causal=True), np.arange(S), REAL),
    "causal-padded": (Visibility(causal=True), np.arange(3, S), PAD),
    "arm-newest-row": (Visibility(causal=True), np.array([S - 1]), REAL),
    "causal-window": (Visibility(causal=True, window=5), np.arange(S), REAL),
    "causal-window-newest": (Visibility(causal=True, window=5), np.array([S - 1]), PAD),
    "symmetric-window": (Visibility(window=3, window_kind="symmetric"), np.arange(3, S), PAD),
    "block-causal": (Visibility(block=8), np.arange(S), REAL),
    "block-causal-active-block": (Visibility(block=8), np.arange(8, 16), REAL),  # a KV-cached block
    "block-causal-window": (Visibility(block=8, window=6, window_kind="causal"), np.arange(S), REAL),
    "canvas-cache-window": (Visibility(window=7, window_kind="cache"), np.arange(S - 8, S), REAL),
    "canvas-global": (Visibility(), np.arange(S - 8, S), PAD),
}


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_coverage_equals_brute_force(name):
    vis, q, real = LAYOUTS[name]
    seen, expected, n_q = brute(q, real, vis)
    cov = np_rule.coverage(q, real, [vis])
    np.testing.assert_allclose(cov.seen[0], seen)
    np.testing.assert_allclose(cov.expected[0], expected, rtol=1e-12, atol=1e-12)
    assert int(cov.n_queries[0]) == n_q
    # the rows of a uniform attention matrix sum to 1, so the expectations sum to Q
    assert expected.sum() == pytest.approx(n_q)


def test_reductions():
    """Bidirectional, every position a query: 1 per key. Causal: H_S − H_j."""
    cov = np_rule.coverage(np.arange(S), REAL, [Visibility(), Visibility(causal=True)])
    np.testing.assert_allclose(cov.expected[0], np.ones(S))
    H = np.concatenate([[0.0], np.cumsum(1.0 / np.arange(1, S + 1))])      # H_0 .. H_S
    np.testing.assert_allclose(cov.expected[1], H[S] - H[np.arange(S)])


def planted(rng, L, H, q, real, visibilities):
    """Random attention rows over each query's visible keys (a dense softmax), summed into
    column sums, with a few sinks planted: (L, H, S)."""
    out = np.zeros((L, H, S))
    for l, vis in enumerate(visibilities):
        ok = dense_visibility(q, real, vis)                            # (Q, S)
        for h in range(H):
            logits = rng.normal(size=ok.shape)
            sink = rng.choice(np.flatnonzero(ok.any(0)))
            logits[:, sink] += rng.uniform(0, 4)                      # some heads get a strong sink
            p = np.where(ok, np.exp(logits), 0.0)
            p /= np.maximum(p.sum(1, keepdims=True), 1e-30)
            out[l, h] = p.sum(0)
    return out


def brute_scores(received, units, q, real, visibilities):
    """(L, H, S) scores in `units` and Eq. 3 margins, written out key by key from the dense matrix."""
    L, H, _ = received.shape
    scores, margins = np.zeros((L, H, S)), np.full((L, H, S), -np.inf)
    for l, vis in enumerate(visibilities):
        seen, expected, n_q = brute(q, real, vis)
        visible = np.flatnonzero(seen > 0)
        for h in range(H):
            for j in visible:
                r = received[l, h, j]
                scores[l, h, j] = {"sum": r, "mean": r / max(n_q, 1), "scaled_sum": r * len(visible) / max(n_q, 1),
                                   "gu": r / seen[j], "uniform_ratio": r / expected[j]}[units]
            for j in visible if len(visible) > 1 else ():
                others = [scores[l, h, k] for k in visible if k != j]
                margins[l, h, j] = scores[l, h, j] - sum(others) / len(others)
    return scores, margins


@pytest.mark.parametrize("name", sorted(LAYOUTS))
@pytest.mark.parametrize("units", sorted(UNITS))
def test_scores_and_sinks_equal_brute_force(name, units):
    vis, q, real = LAYOUTS[name]
    rng = np.random.default_rng(abs(hash((name, units))) % 2**32)
    # two layers with different visibility: the layout's and its unwindowed version
    visibilities = [vis, Visibility(causal=vis.causal, block=vis.block)]
    received = planted(rng, 2, 3, q, real, visibilities)                # (L, H, S)
    cov = np_rule.coverage(q, real, visibilities)
    sc = np_rule.to_scores(received, units, cov)                        # (L, H, S) float32
    margin = np_rule.sink_margin(sc, cov.visible[:, None, :])
    want_sc, want_margin = brute_scores(received, units, q, real, visibilities)

    np.testing.assert_allclose(sc, want_sc, rtol=1e-6, atol=1e-7)
    fin = np.isfinite(want_margin)
    assert (np.isfinite(margin) == fin).all()
    np.testing.assert_allclose(margin[fin], want_margin[fin], rtol=1e-5, atol=1e-5)
    for eps in (DEFAULT_EPS, 0.5, 0.0):
        a = np_rule.is_sink(sc, cov.visible[:, None, :], eps)
        close = np.abs(want_margin - eps) < 1e-4                         # float32 scores: a hair either side
        assert (a == (want_margin >= eps))[~close].all()
    # invisible keys are never sinks, and never anything but 0
    assert not np_rule.is_sink(sc, cov.visible[:, None, :], -1e9)[~np.broadcast_to(cov.visible[:, None, :], sc.shape)].any()
    assert (sc[~np.broadcast_to(cov.visible[:, None, :], sc.shape)] == 0).all()


def test_scaled_sum_is_the_column_sum_where_every_key_is_a_query():
    rng = np.random.default_rng(0)
    vis = Visibility()
    received = planted(rng, 1, 2, np.arange(3, S), PAD, [vis])
    cov = np_rule.coverage(np.arange(3, S), PAD, [vis])
    np.testing.assert_allclose(np_rule.to_scores(received, "scaled_sum", cov), np_rule.to_scores(received, "sum", cov),
                               rtol=1e-6)
    # the average visible key scores 1 in every layout
    for name, (v, q, real) in LAYOUTS.items():
        c = np_rule.coverage(q, real, [v])
        sc = np_rule.to_scores(planted(rng, 1, 1, q, real, [v]), "scaled_sum", c)
        assert sc[0, 0][c.visible[0]].mean() == pytest.approx(1.0, rel=1e-5), name


def test_invisible_keys_do_not_manufacture_sinks():
    """A causal window: keys outside every query's window receive 0. Counted in the mean they
    would push ordinary keys over ε; the rule ignores them."""
    vis = Visibility(causal=True, window=4)
    q = np.array([S - 1])                       # the newest row sees 4 keys of 24
    received = np.zeros((1, 1, S))
    received[0, 0, S - 4:] = [0.1, 0.2, 0.3, 0.4]
    cov = np_rule.coverage(q, REAL, [vis])
    assert cov.visible[0].sum() == 4
    sc = np_rule.to_scores(received, "scaled_sum", cov)
    assert not np_rule.is_sink(sc, cov.visible[:, None, :]).any()
    # the old rule (every real key in the mean) flags the top key of the window
    old_margin = np_rule.sink_margin(received * S, np.ones(S, bool))
    assert (old_margin >= DEFAULT_EPS).any()


def test_layer_visibilities():
    vs = layer_visibilities(3, causal=True, windows=(4, None, 4))
    assert vs[0] == vs[2] and vs[1] == Visibility(causal=True)
    with pytest.raises(ValueError, match="one entry per layer"):
        layer_visibilities(2, windows=(4,))
    with pytest.raises(ValueError, match="window must be a positive int"):
        Visibility(window=0)


@pytest.mark.parametrize("units", sorted(UNITS))
def test_scores_of_float32_float16_and_lists_are_their_float64_scores(units):
    """Every input type gets the scores of its values in float64 (the masking hands float32 arrays, the
    report float16 ones): bit for bit, over a wide range of magnitudes."""
    vis, q, real = LAYOUTS[sorted(LAYOUTS)[0]]
    cov = np_rule.coverage(q, real, [vis, vis])
    rng = np.random.default_rng(5)
    r32 = rng.lognormal(0, 6, (2, 3, S)).astype(np.float32)
    want = np_rule.to_scores(r32.astype(np.float64), units, cov)
    for r in (r32, r32.tolist()):
        assert np.array_equal(np_rule.to_scores(r, units, cov), want)
    r16 = r32.clip(1e-4, 6e4).astype(np.float16)
    assert np.array_equal(np_rule.to_scores(r16, units, cov), np_rule.to_scores(r16.astype(np.float64), units, cov))


def test_scaled_sum_scores_are_the_float64_product_rounded_once():
    """scaled_sum: r_j x K / Q computed in float64 and rounded once to float32, 0 off the visible keys
    (written out here with plain numpy, independently of to_scores' single ufunc call)."""
    rng = np.random.default_rng(11)
    # the layouts, and 7 summed rows: K / Q = 24 / 7, a factor float32 cannot hold
    cases = list(LAYOUTS.values()) + [(Visibility(), np.array([0, 5, 9, 13, 20, 22, 23]), REAL)]
    for name, (vis, q, real) in enumerate(cases):
        cov = np_rule.coverage(q, real, [vis, vis])
        for dtype in (np.float32, np.float16, np.float64):
            r = rng.lognormal(0, 6, (2, 3, S)).clip(0, 6e4).astype(dtype)
            factor = (cov.visible.sum(-1) / np.maximum(cov.n_queries, 1))[:, None, None]   # (L, 1, 1) K / Q
            want = np.where(cov.visible[:, None, :], r.astype(np.float64) * factor, 0.0).astype(np.float32)
            got = np_rule.to_scores(r, "scaled_sum", cov)
            assert got.dtype == np.float32 and got.tobytes() == want.tobytes(), (name, dtype)
