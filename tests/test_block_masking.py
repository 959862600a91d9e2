"""Sink masking (sinklens/masking/) on the block families: SDAR (block-causal, keys of finished
blocks read from its KV cache), LLaDA2.0 and LLaDA2.1 (block-causal, the whole window re-run every
step, LLaDA2.1 rewriting committed tokens), on their official-format fixtures (tests/fixtures).

What a user relies on:
- every key the policy blocks receives exactly 0 from every query of the step (SDAR: also the
  keys that live in the cache, read by the active block's queries), except from a query whose
  visible keys are all blocked (blocks of 4 and K = 5: the first block's queries), which keeps its
  unblocked row rather than a 0/0 softmax;
- the keys blocked at a step are exactly those ranked on the step before, so a sink that stays a
  sink stays masked from one block into the next (the key count grows by a block: the new keys
  start unblocked);
- masking changes the generation (the tokens) against the unmasked run of the same settings."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

import sinklens
from sinklens.masking.policy import MaskingConfig, SinkMaskingPolicy
from sinklens.samplers import CaptureOptions

FIXTURES = Path(__file__).resolve().parent / "fixtures"
# name: (fixture, sampler settings; greedy, no stop, 3 blocks after the prompt)
CASES = {
    "sdar": ("sdar", dict(gen_length=12, block_length=4, denoising_steps=4, top_k=1, stopping_criteria_idx=[])),
    "llada2": ("llada2", dict(sampler="llada2", gen_length=12, block_length=4, steps=4, threshold=0.9)),
    "llada21": ("llada2", dict(sampler="llada21", gen_length=12, block_length=4, threshold=0.9, editing_threshold=0.3)),
}

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def models():
    return {name: sinklens.load(FIXTURES / name) for name in ("sdar", "llada2")}


def prompt(m, n: int = 9) -> torch.Tensor:
    """A random prompt of n ordinary ids (below the end and mask ids)."""
    top = min(i for i in (m.mask_id, m.eos_id) if i is not None)
    return torch.randint(0, top, (1, n), generator=torch.Generator().manual_seed(4))


def run(m, settings, policy=None):
    events = []
    hooks = [events.append] if policy is None else [policy, events.append]
    every_head = tuple((l, h) for l in range(m.num_layers) for h in range(m.num_heads))
    out = m.generate(prompt(m), hook=hooks, capture=CaptureOptions(map_slices=every_head), **settings)
    return out, events


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("k", [1, 5])
def test_blocked_keys_receive_nothing_and_sinks_stay_masked_across_blocks(models, name, k):
    fixture, settings = CASES[name]
    m = models[fixture]
    policy = SinkMaskingPolicy(MaskingConfig(mask_k=k), num_layers=m.num_layers, model=m)
    unmasked, _ = run(m, settings)
    masked, events = run(m, settings, policy)
    blocks = sorted({ev.block for ev in events})
    assert len(blocks) >= 2, blocks                                    # the run crosses block boundaries
    ranker = SinkMaskingPolicy(MaskingConfig(mask_k=k), num_layers=m.num_layers, model=m)
    bl = settings["block_length"]
    cached = crossing = fallback = exact_zero = 0
    for prev, ev in zip(events, events[1:]):
        req = ev.attention
        blocked = req.blocked.cpu()                                     # (L, 1, H, S_k)
        assert int(blocked.sum()) > 0
        # exactly 0 from every query of the step, wherever the key lives (cache or window), except
        # where a query's visible keys are all blocked
        for (l, h), a in req.maps.items():
            a, b = a[0].cpu(), blocked[l, 0, h]                         # (S_q, S_k), (S_k,)
            s_q, s_k = a.shape
            q_pos, k_pos = torch.arange(s_k - s_q, s_k), torch.arange(s_k)  # the queries are the last rows
            visible = (k_pos[None] // bl) <= (q_pos[:, None] // bl)    # block-causal from position 0
            free = (visible & ~b).any(-1)                               # (S_q,) some visible key unblocked
            assert not bool(a[free][:, b].any())
            assert not bool(a[~visible].any())                          # a later block: never seen
            assert torch.allclose(a.sum(-1), torch.ones(s_q), atol=1e-5)
            fallback += int((~free).sum())
        if bool(req.received.cpu()[blocked].eq(0).all()):
            exact_zero += 1
        cached += int(blocked[..., :ev.block[0]].sum())
        # blocked now = ranked on the step before (its keys; keys new at this step start unblocked)
        expected = ranker.rank_event(prev).blocked
        s_prev = expected.shape[-1]
        assert torch.equal(blocked[..., :s_prev], expected)
        assert not bool(blocked[..., s_prev:].any())
        if ev.block != prev.block:                                      # the first step of a new block
            crossing += 1
            # the boundary is crossed by real sinks: some key ranked on the old block's last step is
            # ranked again on the new block's first, so (by the equality above, at this step and the
            # next) it is blocked on both sides of the boundary
            still = expected & ranker.rank_event(ev).blocked[..., :s_prev]
            assert bool(still.any())
    assert crossing >= 1 and cached > 0                                # keys of earlier blocks were blocked
    if fallback == 0:
        assert exact_zero == len(events) - 1                           # the column sums say it too
    assert masked.sequences.tolist() != unmasked.sequences.tolist()    # masking changed the tokens
