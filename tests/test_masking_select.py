"""The masking's default selection (top-1 per head, scaled_sum) as one call of the compiled kernel
(`select._compiled_top1`, onepass.c's `sl_top1`) against the numpy path it stands in for: the same
blocked keys, scores and visible keys, bit for bit, and the same masked generations."""
import numpy as np
import pytest
import torch

import sinklens
from sinklens.attention.routes import build
from sinklens.eval.arith import heldout_problems
from sinklens.experiments.twins import LOAD, arm_sampler, dlm_sampler
from sinklens.masking import select as SEL
from sinklens.masking.config import MaskingConfig
from sinklens.masking.policy import SinkMaskingPolicy
from sinklens.rule import np_rule
from sinklens.rule.spec import layer_visibilities
from sinklens.train.batch import encode_prompts

pytestmark = pytest.mark.skipif(build.load() is None, reason="the compiled kernel does not build here")


def numpy_path(monkeypatch):
    """Within the test: `select` without the kernel (its numpy path)."""
    monkeypatch.setattr(SEL, "_top1_kernel", lambda: None)


def case(rng, trial: int, L=4, H=3, S=23):
    """Random ranking sources with what the compiled path must match: ties, NaN, -inf, zeros, padded
    and unseen keys, causal and bidirectional layers, one or two batch rows, scopes that cut."""
    B = 1 + trial % 2
    received = rng.random((L, B, H, S)).astype(np.float32)
    if trial % 3 == 0:
        received = np.round(received * 4) / 4                     # equal maxima: the first one wins
    if trial % 5 == 0:
        received[rng.integers(L), 0, rng.integers(H)] = 0.0       # a head that received nothing
    if trial % 7 == 0:
        received[rng.integers(L), 0, rng.integers(H), rng.integers(S)] = np.nan
    if trial % 11 == 0:
        received[rng.integers(L), 0, rng.integers(H)] = -np.inf   # every key -inf: numpy's argmax keeps key 0
    covs = []
    for b in range(B):
        real = rng.random(S) > 0.25
        real[-1] = True
        queries = np.flatnonzero(real)[-int(rng.integers(1, 8)):]   # K / Q of every kind (7 keys / 3 rows ...)
        covs.append(np_rule.coverage(queries, real, layer_visibilities(L, causal=bool(trial % 2))))
    scope = rng.random((B, S)) > (0.0 if trial % 4 == 0 else 0.4)
    return received, covs, scope


@pytest.mark.parametrize("room", [0, 1])
def test_the_compiled_top1_is_the_numpy_selection_bit_for_bit(monkeypatch, room):
    rng, cfg = np.random.default_rng(0), MaskingConfig()
    assert SEL.is_default_top1(cfg)
    for trial in range(200):
        received, covs, scope = case(rng, trial)
        fast = SEL._compiled_top1(received, covs, scope, cfg.sink_eps, room)
        with monkeypatch.context() as m:
            numpy_path(m)
            slow = SEL.select(received, covs, scope, cfg, room=room)
        assert fast is not None
        assert torch.equal(fast.blocked, slow.blocked), trial
        assert np.array_equal(fast.scores, slow.scores, equal_nan=True), trial
        assert np.array_equal(fast.visible, slow.visible) and fast.eps == slow.eps
        if room:
            assert np.array_equal(fast._wide, slow._wide)
        assert fast.sink_array.shape == slow.sink_array.shape and np.array_equal(fast.sink_array, slow.sink_array)


def test_only_the_default_selection_takes_the_kernel(monkeypatch):
    calls = []
    real_fast = SEL._compiled_top1
    monkeypatch.setattr(SEL, "_compiled_top1", lambda *a: calls.append(1) or real_fast(*a))
    received, covs, scope = case(np.random.default_rng(1), 1)
    for cfg, taken in [(MaskingConfig(), True), (MaskingConfig(mask_k=2), False), (MaskingConfig(units="sum"), False),
                       (MaskingConfig(sinks="eq3"), False), (MaskingConfig(control="random"), False),
                       (MaskingConfig(threshold=1.0), False), (MaskingConfig(ranking="global"), False),
                       (MaskingConfig(layers=(0,)), False), (MaskingConfig(fraction=0.1), False)]:
        calls.clear()
        SEL.select(received, covs, scope, cfg, priority=np.random.default_rng(0).random(received.shape))
        assert bool(calls) == taken, cfg
    # a ranking source in another precision keeps the numpy path (its product is not made from float32)
    assert SEL._compiled_top1(received.astype(np.float64), covs, scope, 3.0, 0) is None


@pytest.mark.parametrize("name", ["tiny-arm", "tiny-dlm"])
def test_masked_generations_are_the_same_with_and_without_the_kernel(monkeypatch, name):
    """What a user relies on: the tokens a masked generation makes and its record of what was blocked."""
    m = sinklens.load(name, **LOAD)
    ids, am = encode_prompts(m.tokenizer, [p.question for p in heldout_problems(2)])
    settings = dict(arm_sampler(), max_new_tokens=8) if not m.is_diffusion else dlm_sampler()
    out = []
    for kernel in (True, False):
        with monkeypatch.context() as mp:
            if not kernel:
                numpy_path(mp)
            policy = SinkMaskingPolicy(MaskingConfig(), num_layers=m.num_layers, is_diffusion=m.is_diffusion, model=m)
            seqs = m.generate(ids, attention_mask=am, hook=policy, **settings).sequences
            out.append((seqs, policy.summary()))
    assert torch.equal(out[0][0], out[1][0])
    assert out[0][1] == out[1][1] and out[0][1]["blocked_entries"] > 0
