"""The record of what a masking run blocked (masking/stats.py) counts steps in batches; it must say
exactly what counting each step as it came says. The reference below is written out with plain
loops over every (step, layer, row, head, key), independently of the batched array code."""
from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch

from sinklens.masking import stats as stats_mod
from sinklens.masking.select import Selection
from sinklens.masking.stats import MaskingStats
from sinklens.rule import np_rule


def _steps(rng, L=2, B=2, H=3, S0=5, T=9, grow=True):
    """Random masked steps; an ARM-like run grows one key a step; some steps are skipped."""
    out = []
    for t in range(T):
        S = S0 + t if grow else S0
        Sb = S - 1 if grow and t else S            # the selection was made at the previous step
        blocked = rng.random((L, B, H, Sb)) < 0.3
        visible = rng.random((L, B, 1, Sb)) < 0.9
        # as select makes them (np_rule.to_scores): 0 off the visible keys
        scores = np.where(visible, rng.gamma(0.5, 2.0, (L, B, H, Sb)), 0.0).astype(np.float32)
        sel = Selection(blocked=torch.from_numpy(blocked), scores=scores, visible=visible, eps=1.0,
                        shortfall=int(rng.integers(0, 2)))
        tokens = rng.integers(0, 7, (B, S))
        masked, prompt, real = (rng.random((B, S)) < p for p in (0.5, 0.3, 0.9))
        out.append((sel, tokens, masked, prompt, real, rng.random() < 0.2))   # last: a skip before it
    return out


def _reference(steps) -> dict:
    c = Counter()
    tokens_c, pos_c = Counter(), Counter()
    prev = None
    for sel, tokens, masked, prompt, real, skip in steps:
        if skip:
            prev = None
        blocked = sel.blocked.numpy()
        sinks = np_rule.is_sink(sel.scores, sel.visible, sel.eps)
        L, B, H, Sb = blocked.shape
        c["steps"] += 1
        c["key_slots"] += int(real.sum()) * L * H
        c["head_slots"] += L * B * H
        c["shortfall"] += sel.shortfall
        for l in range(L):
            for b in range(B):
                for h in range(H):
                    c["heads_blocking"] += bool(blocked[l, b, h].any())
                    for k in range(Sb):
                        if not blocked[l, b, h, k]:
                            continue
                        c["entries"] += 1
                        c["sinks"] += bool(sinks[l, b, h, k])
                        c["prompt"] += bool(prompt[b, k])
                        c["mask"] += bool(masked[b, k])
                        tokens_c[int(tokens[b, k])] += 1
                        pos_c[k] += 1
                        if prev is not None and k < prev.shape[-1] and prev[l, b, h, k]:
                            c["kept"] += 1
        if prev is not None:
            c["prev_total"] += int(prev.sum())
        prev = blocked
    return {"c": c, "tokens": tokens_c, "pos": pos_c}


@pytest.mark.parametrize("fold_steps", [1, 2, 4, 64])
@pytest.mark.parametrize("grow", [True, False])
def test_batched_record_equals_counting_each_step(monkeypatch, fold_steps, grow):
    monkeypatch.setattr(stats_mod, "FOLD_STEPS", fold_steps)
    rng = np.random.default_rng(fold_steps + 10 * grow)
    steps = _steps(rng, grow=grow)
    st = MaskingStats()
    for sel, tokens, masked, prompt, real, skip in steps:
        if skip:
            st.skip()
        st.add(sel, tokens, masked, prompt, real)
    st.flush()
    ref = _reference(steps)
    c = ref["c"]
    got = {"steps": st.steps_masked, "entries": st.entries, "key_slots": st.key_slots, "head_slots": st.head_slots,
           "heads_blocking": st.heads_blocking, "sinks": st.sinks, "prompt": st.prompt, "mask": st.mask_tokens,
           "kept": st.kept, "prev_total": st.prev_total, "shortfall": st.shortfall}
    assert got == {k: c[k] for k in got}
    assert c["entries"] > 0 and c["kept"] > 0 and c["sinks"] > 0     # the case exercises every counter
    assert st.token_ids == ref["tokens"] and st.positions == ref["pos"]
    s = st.summary()
    assert s["blocked_entries"] == c["entries"] and s["persistence"] == c["kept"] / c["prev_total"]


def test_bytes_bound_the_held_steps(monkeypatch):
    """Held steps are counted once they hold FOLD_BYTES, whatever their number (a large model's)."""
    monkeypatch.setattr(stats_mod, "FOLD_BYTES", 1000)
    rng = np.random.default_rng(0)
    st = MaskingStats()
    for sel, tokens, masked, prompt, real, _ in _steps(rng, L=4, H=8, S0=20, grow=False):
        st.add(sel, tokens, masked, prompt, real)
        assert len(st._held) <= 1
    assert st.steps_masked == 9


def test_the_record_counts_the_sinks_each_selection_names():
    """The counted Eq. 3 sinks are those of each step's own Selection.sinks, whether counted for
    several steps at once (steps of one shape) or step by step (an ARM's growing steps)."""
    for grow in (False, True):
        rng = np.random.default_rng(7)
        steps = _steps(rng, grow=grow)
        st = MaskingStats()
        for sel, tokens, masked, prompt, real, _ in steps:
            st.add(sel, tokens, masked, prompt, real)
        st.flush()
        want = sum(int((s.sinks.numpy() & s.blocked.numpy()).sum()) for s, *_ in steps)
        assert st.sinks == want and want > 0


def test_a_growing_run_counts_with_each_steps_own_row_sums():
    """An ARM's steps are counted at once, zero-padded to the longest; a sum over a padded row can round
    differently from the step's own (numpy sums 8 lanes at a time), which flips a key whose margin is
    exactly ε. Such a row, found by search: the record must say what the step's own Selection.sinks says."""
    rng = np.random.default_rng(3)
    for _ in range(100_000):   # (float64 sums of float32 scores round only over a wide range of magnitudes)
        row = rng.lognormal(0, 6, 9).astype(np.float32)   # 9 keys, padded to 16 in the record below
        margin = np_rule.sink_margin(row)[0]
        padded = np_rule.sink_margin(np.concatenate([row, np.zeros(7, np.float32)]),
                                     np.arange(16) < 9)[0]
        if padded < margin:
            break
    else:
        pytest.fail("no row whose padded sum rounds differently")
    scores = row.reshape(1, 1, 1, 9)
    sel = Selection(blocked=torch.from_numpy(np.arange(9) == 0).reshape(1, 1, 1, 9), scores=scores,
                    visible=np.ones((1, 1, 1, 9), bool), eps=float(margin))
    assert bool(sel.sinks[0, 0, 0, 0])                    # key 0's margin is ε exactly: a sink
    longer = Selection(blocked=torch.zeros(1, 1, 1, 16, dtype=torch.bool), scores=np.zeros((1, 1, 1, 16), np.float32),
                       visible=np.ones((1, 1, 1, 16), bool), eps=float(margin))
    st = MaskingStats()
    for s, S in ((sel, 9), (longer, 16)):
        st.add(s, np.zeros((1, S), np.int64), np.zeros((1, S), bool), np.zeros((1, S), bool), np.ones((1, S), bool))
    st.flush()
    assert st.sinks == 1
