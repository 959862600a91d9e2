"""Analysis on saved arrays: units, Eq. 3, ε sweep, planted sink dynamics recovered exactly."""
from __future__ import annotations

import json
import sys
from collections import Counter

import numpy as np
import pytest

import _planted as P
from sinklens.analysis import (AnalysisInputError, ArraySource, analyze, categorize, eps_sweep, is_sink,
                               largest_sink, scores, sink_margin, top_k, uniform_expectation)
from sinklens.analysis.dynamics import track_sinks


# ---- units ----------------------------------------------------------------------------------
def _causal_uniform_map(S: int) -> np.ndarray:
    """(S, S) causal attention where query i spreads evenly over keys 0..i."""
    A = np.tril(np.ones((S, S)))
    return A / A.sum(-1, keepdims=True)


def test_causal_uniform_baseline_is_harmonic_and_ratio_is_one():
    S = 64
    r = _causal_uniform_map(S).sum(0)                                   # column sums
    H = np.concatenate([[0.0], np.cumsum(1.0 / np.arange(1, S + 1))])   # H_0..H_S
    np.testing.assert_allclose(r, H[S] - H[np.arange(S)], rtol=1e-12)   # H_S − H_j
    assert 4.3 < r[0] < 4.8                                             # ≈ ln 64 + 0.58
    np.testing.assert_allclose(uniform_expectation(np.arange(S), np.ones(S, bool), causal=True), r, rtol=1e-9)
    np.testing.assert_allclose(scores(r, units="uniform_ratio", causal=True), 1.0, rtol=1e-5)
    # the raw rule flags position 0 of a uniform causal head, the ratio does not
    assert is_sink(r)[0] and not is_sink(scores(r, units="uniform_ratio", causal=True)).any()


def test_gu_and_mean_units_against_explicit_visibility():
    rng = np.random.default_rng(1)
    S = 10
    key_mask = np.ones(S, bool)
    key_mask[-2:] = False                                               # right padding
    vis = np.tril(np.ones((S, S), bool)) & key_mask[None, :] & key_mask[:, None]   # (S_q, S_k)
    logits = np.where(vis, rng.normal(size=(S, S)), -np.inf)
    logits[~key_mask] = 0.0                                             # padded query rows: never summed
    A = np.exp(logits - logits.max(-1, keepdims=True))
    A = np.nan_to_num(A / A.sum(-1, keepdims=True))
    q = np.flatnonzero(key_mask)
    r = A[q].sum(0)
    seen = vis[q].sum(0)                                                # queries that see key j
    np.testing.assert_allclose(scores(r, units="gu", query_positions=q, key_mask=key_mask, causal=True)[key_mask],
                               r[key_mask] / seen[key_mask], rtol=1e-5)
    np.testing.assert_allclose(scores(r, units="mean", query_positions=q, key_mask=key_mask), r * key_mask / q.size,
                               rtol=1e-5)
    assert (scores(r, units="sum", key_mask=key_mask)[~key_mask] == 0).all()
    # bidirectional uniform: every real key expects S_q / S_k
    np.testing.assert_allclose(uniform_expectation(q, key_mask)[key_mask], q.size / key_mask.sum())
    with pytest.raises(ValueError, match="units must be one of"):
        scores(r, units="percent")


# ---- Eq. 3, top-K, sweep ---------------------------------------------------------------------
def test_eq3_margin_by_hand_and_padding_never_sinks():
    s = np.array([10.0, 1.0, 1.0, 1.0, 50.0])
    km = np.array([True, True, True, True, False])                      # the 50 is padding
    m = sink_margin(s, km)
    assert m[0] == pytest.approx(10 - 1) and m[1] == pytest.approx(1 - 4)
    assert m[4] == -np.inf
    assert is_sink(s, km, 3.0).tolist() == [True, False, False, False, False]
    assert is_sink(s, km, 9.0)[0] and not is_sink(s, km, 9.01)[0]       # ≥ ε, boundary included
    assert top_k(s, 3, km).tolist() == [0, 1, 2]                        # ties → lower position first
    assert top_k(s[:2], 3).tolist() == [0, 1, -1]
    assert largest_sink(s, 3.0, km)[0] == 0
    # the paper's written mean (≤ 1) never fires at ε = 3: the units trap
    S = 64
    A = np.full((S, S), 0.001)
    A[:, 5] = 1.0
    A /= A.sum(-1, keepdims=True)
    assert is_sink(scores(A.sum(0)))[5] and not is_sink(scores(A.sum(0), units="mean")).any()


def test_eps_sweep_is_monotone_and_counts_real_keys():
    src = P.source()
    a = analyze(src)
    f = a.eps_sweep.fraction
    assert (np.diff(f) <= 0).all() and f[0] > f[-1]
    assert a.eps_sweep.n_tokens == P.T * P.L * P.H * P.S
    # independent count at ε = 3: cells with margin ≥ 3, recomputed from the raw arrays
    d = P.build()
    direct = sum(is_sink(d["received"][t]).sum() for t in range(P.T)) / (P.T * P.L * P.H * P.S)
    assert f[list(a.config.eps_values).index(3.0)] == pytest.approx(direct)
    sw = eps_sweep(np.random.default_rng(0).gamma(0.3, 3.0, size=(50, 64)), np.linspace(0, 20, 81))
    assert (np.diff(sw.fraction) <= 0).all() and sw.units == "scaled_sum"
    x = np.random.default_rng(1).gamma(0.3, 3.0, size=(20, 64))
    grid = [5.0, 0.0, 2.5, 10.0]                                       # any order
    m = sink_margin(x)
    assert eps_sweep(x, grid).fraction.tolist() == pytest.approx([(m >= e).mean() for e in grid])


# ---- planted dynamics -------------------------------------------------------------------------
@pytest.fixture(scope="module")
def planted():
    return analyze(P.source())


def test_planted_sinks_recovered_exactly(planted):
    s = planted.sinks
    for t in range(P.T):
        for (l, h), want in P.expected_sinks(t).items():
            sel = (s["step"] == t) & (s["layer"] == l) & (s["head"] == h)
            assert set(s["pos"][sel].tolist()) == want, (t, l, h)


def test_planted_tracks_and_classes(planted):
    got = {(tr.layer, tr.head, tuple(tr.steps), tuple(tr.positions)): tr.kind for tr in planted.tracks}
    r = range
    want = {
        (0, 0, tuple(r(12)), (0,) * 12): "static",
        (0, 1, tuple(r(9)), (10,) * 5 + (20,) * 4): "moving",
        (0, 2, tuple(r(12)), (31,) * 12): "static",
        (0, 2, (3, 4), (7, 7)): "vanishing",
        (1, 0, tuple(r(12)), (3,) * 12): "static",
        (1, 0, (0, 1, 2, 3), (25,) * 4): "vanishing",
        (1, 2, tuple(r(12)), (5, 6) + (7,) * 10): "moving",
        (1, 2, tuple(r(12)), (28, 27) + (26,) * 10): "moving",
    }
    assert got == want
    classes = {(d["layer"], d["head"]): d["class"] for d in planted.head_summaries()}
    assert classes == {(0, 0): "static", (0, 1): "moving", (0, 2): "static", (1, 0): "static",
                       (1, 1): "none", (1, 2): "moving"}
    # largest sink (Fig. 7): the moving head jumps once, then vanishes
    assert planted.largest_pos[:, 0, 1].tolist() == [10] * 5 + [20] * 4 + [-1] * 3


def test_planted_drift_and_blocks(planted):
    ev = sorted((e.layer, e.head, e.step, e.from_pos, e.to_pos) for e in planted.drift)
    assert ev == [(0, 1, 5, 10, 20), (1, 2, 1, 5, 6), (1, 2, 1, 28, 27), (1, 2, 2, 6, 7), (1, 2, 2, 27, 26)]
    jump = next(e for e in planted.drift if e.head == 1 and e.layer == 0)
    assert jump.distance == 10 and jump.from_block == -1 and jump.to_block == 0   # prompt -> block 0
    left = [e for e in planted.drift if e.to_pos > 20]
    assert all(e.distance == -1 for e in left)
    d = planted.to_dict()["drift"]
    assert d["moves"] == 5 and d["fraction_leftward"] == pytest.approx(2 / 5)


def test_planted_split(planted):
    got = sorted((e.step, e.layer, e.head, e.masked_pos, e.unmasked_pos) for e in planted.splits)
    assert got == [(t, 1, 0, 25, 3) for t in range(5)]    # while any query is still masked


def test_planted_sink_tokens(planted):
    want = Counter()
    tokens = P.build()["tokens"]
    for t in range(P.T):
        for _, keys in P.expected_sinks(t).items():
            for k in keys:
                want[int(tokens[t, k])] += 1
    got = {r.token_id: r.count for r in planted.token_table.rows}
    assert got == dict(want)
    cats = planted.token_table.categories
    assert cats["mask"]["count"] == want[P.MASK_ID] and cats["special"]["count"] == want[0]
    assert sum(c["fraction"] for c in cats.values()) == pytest.approx(1.0)
    md, csv = planted.token_table.to_markdown(), planted.token_table.to_csv()
    assert "fraction" in md and csv.splitlines()[0].endswith("fraction_of_sink_occurrences")


@pytest.mark.parametrize("tok,tid,cat", [("Ċ", 1, "whitespace"), ("Ġ", 2, "whitespace"), ("▁", 3, "whitespace"),
                                         (".", 4, "punctuation"), (",", 5, "punctuation"), ("<|mdm_mask|>", 9, "mask"),
                                         ("<|endoftext|>", 6, "special"), ("</s>", 7, "special"), ("Ġthe", 8, "other")])
def test_token_categories(tok, tid, cat):
    assert categorize(tok, tid, mask_id=9, special_ids=()) == cat


def test_output_states_units(planted):
    d = json.loads(json.dumps(planted.to_dict()))
    assert d["units"] == "scaled_sum" and "column sum" in d["units_meaning"] and d["sink_eps"] == 3
    assert d["visibility"] == ["bidirectional"] * P.L
    for k in ("layer_head", "largest_sink_score", "score_distribution", "eps_sweep"):
        assert d[k]["units"] == "scaled_sum", k
    a2 = analyze(P.source(), units="uniform_ratio")
    assert a2.to_dict()["units"] == "uniform_ratio"


def test_track_linking_rule_nearest_first():
    # two sinks swap strength while moving: the linking follows positions, not ranks
    per_step = [(np.array([10, 30]), np.array([9.0, 5.0])), (np.array([12, 29]), np.array([4.0, 8.0]))]
    tr = track_sinks(per_step)
    assert sorted(tuple(t.positions) for t in tr) == [(10, 12), (30, 29)]
    tr = track_sinks(per_step, max_move=1)   # 10 -> 12 is too far: death + birth
    assert sorted(tuple(t.positions) for t in tr) == [(10,), (12,), (30, 29)]


# ---- bad inputs ------------------------------------------------------------------------------
def test_bad_inputs_clear_errors():
    with pytest.raises(AnalysisInputError, match="empty"):
        ArraySource(np.zeros((0, 2, 2, 4)), np.zeros((0, 4)))
    with pytest.raises(AnalysisInputError, match=r"received must be \(T, L, H, S\)"):
        ArraySource(np.zeros((2, 4)), np.zeros((2, 4)))
    with pytest.raises(AnalysisInputError, match="tokens must be"):
        ArraySource(np.zeros((2, 1, 1, 4)), np.zeros((2, 5)))
    src = P.source()
    with pytest.raises(AnalysisInputError, match="layer 7 out of range.*2 layers"):
        src.check_layer_head(7, 0)
    with pytest.raises(AnalysisInputError, match="head 3 out of range.*3 heads"):
        analyze(src).score_slice(0, 3)
    with pytest.raises(TypeError, match="unknown option"):
        analyze(src, epsilon=2)


def test_analysis_imports_no_torch():
    import subprocess
    code = ("import sys, sinklens.analysis, sinklens.report.figures; "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_track_pairing_equals_brute_force_greedy():
    """The O(n log n) pairing equals the rule as written: all (old, new) pairs sorted by
    (distance, −old score, old, new), taken greedily."""
    from sinklens.analysis.dynamics import _pair

    def brute(prev, new, max_move):
        pairs = {p: p for p in prev if p in new}
        cands = sorted((abs(p - q), -prev[p], p, q) for p in prev if p not in pairs for q in new
                       if q not in pairs.values() and (max_move is None or abs(p - q) <= max_move))
        used_p, used_q = set(), set()
        for _, _, p, q in cands:
            if p not in used_p and q not in used_q:
                pairs[p] = q
                used_p.add(p)
                used_q.add(q)
        return pairs

    rng = np.random.default_rng(0)
    for k in range(2000):
        prev = {int(p): float(rng.integers(0, 3)) for p in rng.choice(40, rng.integers(0, 8), replace=False)}
        new = {int(q): 1.0 for q in rng.choice(40, rng.integers(0, 8), replace=False)}
        mm = (None, 3)[k % 2]
        assert _pair(prev, new, mm) == brute(prev, new, mm), (prev, new, mm)


def test_rank_swaps_are_not_moves():
    """Two standing sinks that swap the top rank by a hair are no moving sink; a sink that leaves
    its position for one that was no sink before is (the paper's moving sink)."""
    T, S = 4, 12
    received = np.ones((T, 1, 1, S), np.float32)
    received[:, 0, 0, [2, 7]] = 6.0                  # two sinks at every step
    received[1, 0, 0, 7] = 6.5                       # step 1: position 7 ranks first (a swap)
    received[2, 0, 0, 7] = 1.0                       # step 2: 7 is gone, 9 appears and leads
    received[2, 0, 0, 9] = 7.0
    received[3, 0, 0, 9] = 1.0                       # step 3: 9 gone, only 2 left (2 stays)
    a = analyze(ArraySource(received, np.zeros((T, S), int)))
    assert a.largest_pos[:, 0, 0].tolist() == [2, 7, 9, 2]
    moved, swapped = a.largest_changes()
    assert moved[:, 0, 0].tolist() == [False, True, False]       # 7 -> 9: 7 stopped, 9 was none
    assert swapped[:, 0, 0].tolist() == [True, False, True]      # 2 -> 7 and 9 -> 2: both standing
    head = a.head_summaries()[0]
    assert head["largest_moves"] == 1 and head["largest_rank_swaps"] == 2
