"""The distance profile's uniform baseline under sliding windows and blocks: the rule module's
visibility (np_rule.distance_expectation) against a brute force that lists each query's keys by
the layout's own definition, and a trace whose attention *is* uniform reads a ratio of 1."""
from __future__ import annotations

import numpy as np
import pytest

from sinklens.analysis import ArraySource, analyze
from sinklens.rule import np_rule
from sinklens.rule.spec import Visibility
from sinklens.trace.layout import TraceLayout

S = 13


def sees(i: int, j: int, layout: str, n: int) -> bool:
    """Written from the layouts' definitions, not from rule code."""
    if layout == "causal-window":          # transformers' sliding window on a causal layer
        return i - n < j <= i
    if layout == "symmetric-window":       # a bidirectional encoder's local attention
        return abs(i - j) <= n
    if layout == "block-causal":           # blocks of n from position 0, bidirectional inside
        return j // n <= i // n
    raise AssertionError(layout)


def brute_uniform(queries, key_mask, layout, n) -> np.ndarray:
    """(S,) per query row: uniform attention over its visible real keys, binned by |i − j|."""
    out = np.zeros(S)
    for i in queries:
        keys = [j for j in range(S) if key_mask[j] and sees(i, j, layout, n)]
        for j in keys:
            out[abs(i - j)] += 1.0 / len(keys)
    return out / len(queries)


VIS = {"causal-window": lambda n: Visibility(causal=True, window=n, window_kind="causal"),
       "symmetric-window": lambda n: Visibility(window=n, window_kind="symmetric"),
       "block-causal": lambda n: Visibility(block=n)}


@pytest.mark.parametrize("layout,n", [("causal-window", 4), ("symmetric-window", 3), ("block-causal", 4),
                                      ("block-causal", 5)])
def test_expectation_equals_brute_force(layout, n):
    rng = np.random.default_rng(n)
    key_mask = np.ones(S, bool)
    key_mask[rng.choice(S, 2, replace=False)] = False    # padding inside the sequence
    queries = np.sort(rng.choice(np.flatnonzero(key_mask), 7, replace=False))
    got = np_rule.distance_expectation(queries, key_mask, [VIS[layout](n), Visibility()])
    assert np.allclose(got[0], brute_uniform(queries, key_mask, layout, n))
    # the second layer is full bidirectional attention: a different profile, so the layers are not shared
    full = np.zeros(S)
    for i in queries:
        for j in np.flatnonzero(key_mask):
            full[abs(i - j)] += 1.0 / key_mask.sum()
    assert np.allclose(got[1], full / len(queries)) and not np.allclose(got[0], got[1])


def test_uniform_attention_reads_ratio_one_under_windows_and_blocks():
    """A trace whose every query attends uniformly over the keys it sees: its profile equals the
    baseline at every distance, layer by layer (layer 0 a sliding window, layer 1 full)."""
    L, H, T = 2, 2, 2
    layout = TraceLayout(causal=True, windows=(3, None), window_kind="causal")
    vis = layout.visibilities(L)
    received = np.zeros((T, L, H, S), np.float32)
    distance = np.zeros((T, L, H, S), np.float32)
    for l, v in enumerate(vis):
        w = v.window or S
        for i in range(S):
            keys = [j for j in range(S) if i - w < j <= i]
            for j in keys:
                received[:, l, :, j] += 1 / len(keys)
                distance[:, l, :, i - j] += 1 / len(keys)
    src = ArraySource(received, np.ones((T, S), np.int64), causal=True, readouts={"distance": distance})
    src.layout = layout
    prof, uni = analyze(src).distance_profile.profile()
    assert uni.shape == (L, S)
    assert np.allclose(prof, uni, atol=1e-6)
    assert uni[0, 3:].sum() == 0 and uni[1, 3:].sum() > 0    # the window's baseline stops at its width


def test_diffusion_gemma_sliding_layers_attend_only_where_the_baseline_reaches(tmp_path):
    """A real model with sliding layers (DiffusionGemma's tiny checkpoint: window 6 on layers 0-1):
    the captured distance readout of each layer sums to 1 per query row, and lands only at distances
    the rule's visibility gives uniform attention (a sliding layer's baseline stops short of a
    global layer's)."""
    import sinklens
    from sinklens.samplers.capture import CaptureOptions
    from test_diffusion_gemma import CASES, build, our_kwargs, prompt

    m = sinklens.load(build(tmp_path / "dg"))
    m.generate(prompt(), trace=tmp_path / "dg.arrow", capture=CaptureOptions(distance=True),
               **our_kwargs(CASES["defaults"]))
    prof, uni = analyze(tmp_path / "dg.arrow").distance_profile.profile()      # (L, D) each
    assert np.allclose(prof.sum(-1), 1.0, atol=1e-4) and np.allclose(uni.sum(-1), 1.0)
    assert (prof[uni == 0] < 1e-6).all()
    reach = [int(np.flatnonzero(u > 0).max()) for u in uni]
    assert reach[0] == reach[1] < reach[2]
