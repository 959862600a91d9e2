"""SDAR: the loader (Qwen3ForCausalLM under a block-causal mask) and the block sampler with its KV
cache reproduce the official code on a tiny checkpoint in the official format.

Reference: tests/fixtures/sdar, written by JetAstra/SDAR's own modeling file and generate.py
(see its README); nothing there was produced by sinklens.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

import sinklens
from sinklens.attention import AttentionRequest
from sinklens.samplers import CaptureOptions

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "sdar"
CASES = json.loads((FIXTURE / "cases.json").read_text())["cases"]
GENERATE = [c for c in CASES if c["kind"] == "generate"]

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def m():
    return sinklens.load(FIXTURE)


def test_loads_onto_qwen3_block_causal(m):
    from transformers import Qwen3ForCausalLM

    assert m.family.name == "sdar" and m.is_diffusion and m.family.sampler == "sdar"
    assert isinstance(m.model, Qwen3ForCausalLM)
    assert (m.mask_id, m.eos_id) == (300, 299)                        # from config.json, not hard-coded
    assert m.attention_layout["attention_block"] == 4                 # config.json block_size


def test_forward_logits_are_the_official_block_causal_call(m):
    """forward_logits uses the checkpoint's block size (4), as generate()'s mask; plain and capture."""
    ref = load_file(str(FIXTURE / "logits.safetensors"))
    ids = ref["forward_block4.input_ids"]
    for req in (None, AttentionRequest(capture=True)):
        diff = (m.forward_logits(ids, attention=req) - ref["forward_block4.logits"]).abs().max().item()
        assert diff <= 1e-4


@pytest.mark.parametrize("case,block", [("forward_block8_partial", 8), ("forward_full", 10**6)])
def test_other_blocks_through_the_sampler_pass(m, case, block):
    """The sampler's own forward (empty cache, nothing stored) with another block size; a block
    longer than the sequence is the official all-ones (unmasked, flash) call."""
    ref = load_file(str(FIXTURE / "logits.safetensors"))
    ids = ref[f"{case}.input_ids"]
    for req in (None, AttentionRequest(capture=True)):
        cache = m.family.ops.new_cache(m)
        logits = m.family.ops.forward_block(m, ids, 0, cache, store=False, block=block, attention=req)
        assert (logits.float() - ref[f"{case}.logits"]).abs().max().item() <= 1e-4
        assert cache.get_seq_length() == 0                              # read, not stored


def test_block_causal_means_later_blocks_are_unseen(m):
    ids = torch.arange(10, 26)[None]
    other = ids.clone()
    other[0, 8] = 200                                                   # a token of block 2 (positions 8..11)
    a, b = m.forward_logits(ids), m.forward_logits(other)
    assert (a[0, :8] - b[0, :8]).abs().max().item() == 0               # blocks 0 and 1 cannot see it
    assert (a[0, 8:12] - b[0, 8:12]).abs().max().item() > 1e-3         # its own block can


def _run(m, case, capture=None, **extra):
    args = dict(case["arguments"])
    if args["stopping_criteria_idx"] is None:
        args["stopping_criteria_idx"] = []                              # the official function's default: never stop
    torch.manual_seed(case["seed"])
    return m.generate(torch.tensor(case["input_ids"]), capture=capture, **args, **extra)


@pytest.mark.parametrize("capture", [False, True], ids=["plain", "capture"])
@pytest.mark.parametrize("case", GENERATE, ids=[c["name"] for c in GENERATE])
def test_generate_token_exact(m, case, capture):
    out = _run(m, case, CaptureOptions() if capture else None)
    assert out.sequences.tolist() == case["expected_output_ids"]


def test_stop_returns_the_whole_canvas_with_masks(m):
    """As the official function: after a stop the later blocks stay [MASK] and the canvas is whole
    blocks long, longer than prompt + gen_length; [] never stops."""
    case = next(c for c in GENERATE if c["name"] == "greedy_stop")
    P, block = len(case["input_ids"][0]), case["arguments"]["block_length"]
    out = _run(m, case).sequences[0].tolist()
    assert out[-block:] == [m.mask_id] * block and len(out) % block == 0 and len(out) > P + 16
    never = dict(case["arguments"], stopping_criteria_idx=[])
    torch.manual_seed(0)
    assert m.mask_id not in m.generate(torch.tensor(case["input_ids"]), **never).sequences[0].tolist()


def test_traced_and_untraced_are_token_identical(m, tmp_path):
    case = next(c for c in GENERATE if c["name"] == "sample_dynamic")
    plain = _run(m, case)
    traced = _run(m, case, trace=tmp_path / "sdar.arrow")
    assert traced.sequences.tolist() == plain.sequences.tolist()
    t = traced.trace
    layout = t.meta["layout"]
    assert layout["attention_block"] == 4 and layout["query_rows"] == "block" and not layout["causal"]
    assert t.num_steps == traced.num_steps > 0
    assert t.received(0).shape[-1] == 12                               # keys = cache (8) + active block (4)
    assert t.received(t.num_steps - 1).shape[-1] == len(case["expected_output_ids"][0])


def test_hub_id_from_offline_cache(offline_hub):
    offline_hub("JetAstra/SDAR-tiny-Chat", FIXTURE, ("config.json", "generation_config.json", "model.safetensors"))
    hub = sinklens.load("JetAstra/SDAR-tiny-Chat")
    assert hub.family.name == "sdar" and hub.source["kind"] == "hub"
    case = GENERATE[0]
    assert _run(hub, case).sequences.tolist() == case["expected_output_ids"]


@pytest.mark.parametrize("kwargs,message", [
    (dict(temperature=0.0), "temperature"),
    (dict(remasking_strategy="entropy_bounded"), "remasking_strategy"),
])
def test_bad_settings_are_one_clear_error(m, kwargs, message):
    with pytest.raises(ValueError, match=message):
        m.generate(torch.tensor([[1, 2, 3]]), gen_length=4, **kwargs)


def test_batch_and_padding_are_refused(m):
    with pytest.raises(ValueError, match="one prompt at a time"):
        m.generate(torch.tensor([[1, 2, 3], [4, 5, 6]]), gen_length=4)
    with pytest.raises(ValueError, match="no padding"):
        m.generate(torch.tensor([[1, 2, 3]]), attention_mask=torch.tensor([[0, 1, 1]]), gen_length=4)


def test_masking_blocks_cached_keys_for_the_active_block(m):
    """A key blocked by a hook is blocked for the active block's queries even when it lives in the
    KV cache: it receives exactly 0 there, and the model's logits change; unblocked, it is seen."""
    blocked_pos = 2                                                     # a prompt key, cached by the prefill

    class BlockOne:
        wants_attention = True

        def __init__(self, block: bool):
            self.block, self.received, self.logits = block, [], []

        def before_step(self, step, tokens, is_masked):
            req = AttentionRequest(capture=True)
            if self.block:
                req.blocked = torch.zeros(m.num_layers, 1, m.num_heads, tokens.shape[1], dtype=torch.bool)
                req.blocked[..., blocked_pos] = True
            return req

        def after_step(self, event):
            self.received.append(event.attention.received)          # (L, 1, H, S_k)
            self.logits.append(event.logits)

    ids = torch.tensor([list(range(20, 28))])                          # two whole blocks: all cached by the prefill
    kw = dict(gen_length=8, block_length=4, denoising_steps=4, top_k=1, stopping_criteria_idx=[])
    on, off = BlockOne(True), BlockOne(False)
    m.generate(ids, hook=on, **kw)
    m.generate(ids, hook=off, **kw)
    assert on.received and all(float(r[..., blocked_pos].abs().max()) == 0.0 for r in on.received)
    assert float(off.received[0][..., blocked_pos].min()) > 0.0
    assert (on.logits[0] - off.logits[0]).abs().max().item() > 1e-4


def test_masking_ranks_with_the_steps_own_blocks(m):
    """The policy counts visible keys with the step's layout (blocks of the sampler's
    block_length), not the checkpoint's block_size: with blocks of 8 on a block-4 checkpoint the
    two differ, and rank_event follows the step's."""
    from sinklens.masking.policy import MaskingConfig, SinkMaskingPolicy
    from sinklens.rule import np_rule

    events = []
    ids = torch.randint(0, 298, (1, 10), generator=torch.Generator().manual_seed(3))
    m.generate(ids, gen_length=12, block_length=8, denoising_steps=3, top_k=1, stopping_criteria_idx=[],
               capture=CaptureOptions(), hook=events.append)
    policy = SinkMaskingPolicy(MaskingConfig(mask_k=0, units="uniform_ratio"), num_layers=m.num_layers, model=m)
    differ = 0
    for ev in events:
        real = ev.attention_mask.cpu()
        queries = policy._queries(*real.shape, real, ev.query_positions)
        own = ev.layout.visibilities(m.num_layers)
        rows, keys = np.flatnonzero(queries[0]), real[0].numpy()
        seen_own = np_rule.coverage(rows, keys, own).seen
        seen_model = np_rule.coverage(rows, keys, policy.visibilities).seen
        differ += int(not np.array_equal(seen_own, seen_model))
        source = ev.attention.received_unblocked
        expected = policy.rank(source, real=real, queries=queries, visibilities=own).sinks
        assert torch.equal(policy.rank_event(ev).sinks, expected)
    assert differ > 0


def test_sink_masking_policy_blocks_cached_sinks(m):
    """End to end with the masking policy: the keys it blocks at a step (ranked on the previous
    step, the cache included) receive exactly 0 from the active block's queries, and some of them
    are cached keys (before the active block)."""
    from sinklens.masking.policy import MaskingConfig, SinkMaskingPolicy

    seen = []
    policy = SinkMaskingPolicy(MaskingConfig(mask_k=1), num_layers=m.num_layers, model=m)
    ids = torch.randint(0, 298, (1, 9), generator=torch.Generator().manual_seed(4))
    m.generate(ids, gen_length=12, block_length=4, denoising_steps=4, stopping_criteria_idx=[], hook=[policy, seen.append],
               capture=CaptureOptions(received_dtype="float32"))
    cached = 0
    for ev in seen:
        blocked = ev.attention.blocked
        if blocked is None:
            continue
        assert float(ev.attention.received.cpu()[blocked.cpu()].abs().max()) == 0.0
        cached += int(blocked[..., :ev.block[0]].sum())
    assert cached > 0


def test_sdar_moe_is_not_claimed():
    """SDAR's MoE variant is another architecture: refused by name, not loaded into dense Qwen3."""
    from sinklens.models.families import detect_family

    with pytest.raises(ValueError, match="unknown architecture"):
        detect_family({"model_type": "sdar_moe", "architectures": ["SDARMoeForCausalLM"]})


# --- bfloat16: against the official code loaded in bfloat16 (fixtures/sdar/cases_bf16.json) ----
BF16_META = json.loads((FIXTURE / "cases_bf16.json").read_text())
BF16 = BF16_META["cases"]
ON_FIXTURE_KERNELS = pytest.mark.fixture_kernels(BF16_META["kernels"])  # tests/_kernels.py
BF16_GENERATE = [c for c in BF16 if c["kind"] == "generate"]


@pytest.fixture(scope="module")
def m16():
    return sinklens.load(FIXTURE, dtype="bfloat16")


@pytest.mark.parametrize("case", [c for c in BF16 if c["kind"] == "forward"], ids=lambda c: c["name"])
@ON_FIXTURE_KERNELS
def test_bf16_logits_equal_official(m16, case):
    """Every official bf16 forward (block-causal: sdpa's math backend, as the official 3-D mask
    gets; all-ones: the flash call) through the sampler's pass and, for the checkpoint's blocks,
    forward_logits. Capture is checked on the unmasked call, the only kind the sampler captures."""
    from _bf16 import assert_bf16_logits_close

    ref = load_file(str(FIXTURE / "logits_bf16.safetensors"))
    ids, want = ref[f"{case['name']}.input_ids"], ref[f"{case['name']}.logits"]
    assert m16.model.dtype == torch.bfloat16
    requests = (None, AttentionRequest(capture=True)) if case["block"] is None else (None,)
    for req in requests:
        got = m16.family.ops.forward_block(m16, ids, 0, m16.family.ops.new_cache(m16), store=False,
                                           block=case["block"] or 10**6, attention=req)
        assert got.dtype == torch.bfloat16                                  # the official sampler reads bf16 logits
        assert_bf16_logits_close(got, want)
    if case["block"] == 4:
        assert_bf16_logits_close(m16.forward_logits(ids), want)


@pytest.mark.parametrize("capture", [False, True], ids=["plain", "capture"])
@pytest.mark.parametrize("case", BF16_GENERATE, ids=[c["name"] for c in BF16_GENERATE])
@ON_FIXTURE_KERNELS
def test_bf16_generate_token_exact(m16, case, capture):
    assert _run(m16, case, CaptureOptions() if capture else None).sequences.tolist() == case["expected_output_ids"]


@ON_FIXTURE_KERNELS
def test_bf16_traced_and_untraced_are_token_identical(m16, tmp_path):
    case = next(c for c in BF16_GENERATE if c["name"] == "bf16_static_quota_overflow")
    plain = _run(m16, case)
    traced = _run(m16, case, trace=tmp_path / "sdar16.arrow")
    assert traced.sequences.tolist() == plain.sequences.tolist() == case["expected_output_ids"]
    assert traced.trace.num_steps > 0
