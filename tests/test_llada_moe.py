"""LLaDA-MoE: the loader (Qwen3MoeForCausalLM, bidirectional, top-k weights not renormalised) and
LLaDA's sampler reproduce the official code on a tiny checkpoint in the official format.

Reference: tests/fixtures/lladamoe, written by dllm's modeling_lladamoe.py and LLaDA's generate.py
(see its README); nothing there was produced by sinklens.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import sinklens
from sinklens.attention import AttentionRequest
from sinklens.samplers import CaptureOptions

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "lladamoe"
META = json.loads((FIXTURE / "cases.json").read_text())
GENERATE = [c for c in META["cases"] if c["kind"] == "generate"]

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def m():
    return sinklens.load(FIXTURE)


def with_model_type(tmp_path: Path, model_type: str) -> Path:
    folder = tmp_path / model_type
    folder.mkdir()
    shutil.copy(FIXTURE / "model.safetensors", folder / "model.safetensors")
    config = json.loads((FIXTURE / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "model_type": model_type}))
    return folder


def test_loads_onto_qwen3_moe(m):
    from transformers import Qwen3MoeForCausalLM

    assert m.family.name == "llada_moe" and m.family.sampler == "llada" and m.is_diffusion
    assert isinstance(m.model, Qwen3MoeForCausalLM)
    cfg = m.model.config
    assert cfg.norm_topk_prob is False and cfg.mlp_only_layers == [0] and cfg.num_experts_per_tok == 2
    assert m.model.config.is_causal is False
    assert len(META["routing"]["layer1_experts_used_on_embeddings"]) > 2     # routing is not trivial


@pytest.mark.parametrize("capture", [False, True], ids=["plain", "capture"])
@pytest.mark.parametrize("case", ["forward_nopad", "forward_leftpad"])
def test_logits_match_official(m, case, capture):
    ref = load_file(str(FIXTURE / "logits.safetensors"))
    ids, mask = ref[f"{case}.input_ids"], ref.get(f"{case}.attention_mask")
    logits = m.forward_logits(ids, attention_mask=mask, attention=AttentionRequest(capture=True) if capture else None)
    real = torch.ones_like(ids, dtype=torch.bool) if mask is None else mask.bool()
    assert (logits - ref[f"{case}.logits"]).abs()[real].max().item() <= 1e-4


@pytest.mark.parametrize("model_type", ["llada", "lladamoe"])
def test_both_model_type_spellings_load_and_match(tmp_path, model_type):
    """The hub checkpoints say model_type "llada" with architectures ["LLaDAMoEModelLM"]; dllm's
    config class says "lladamoe". Both are LLaDA-MoE, never LLaDA."""
    got = sinklens.load(with_model_type(tmp_path, model_type))
    assert got.family.name == "llada_moe"
    ref = load_file(str(FIXTURE / "logits.safetensors"))
    diff = (got.forward_logits(ref["forward_nopad.input_ids"]) - ref["forward_nopad.logits"]).abs().max().item()
    assert diff <= 1e-4


def _run(m, case, capture=None, **extra):
    if case["seed"] is not None:
        torch.manual_seed(case["seed"])
    mask = None if case["attention_mask"] is None else torch.tensor(case["attention_mask"])
    return m.generate(torch.tensor(case["input_ids"]), attention_mask=mask, capture=capture, **case["arguments"], **extra)


@pytest.mark.parametrize("capture", [False, True], ids=["plain", "capture"])
@pytest.mark.parametrize("case", GENERATE, ids=[c["name"] for c in GENERATE])
def test_generate_token_exact(m, case, capture):
    assert _run(m, case, CaptureOptions() if capture else None).sequences.tolist() == case["expected_output_ids"]


def test_traced_and_untraced_are_token_identical(m, tmp_path):
    case = next(c for c in GENERATE if c["name"] == "generate_random_remask")
    plain = _run(m, case)
    traced = _run(m, case, trace=tmp_path / "moe.arrow")
    assert traced.sequences.tolist() == plain.sequences.tolist()
    assert traced.trace.meta["family"] == "llada_moe" and traced.trace.num_steps == 16


def test_hub_id_from_offline_cache(offline_hub):
    offline_hub("inclusionAI/LLaDA-MoE-tiny-Instruct", FIXTURE, ("config.json", "model.safetensors"))
    hub = sinklens.load("inclusionAI/LLaDA-MoE-tiny-Instruct")
    assert hub.family.name == "llada_moe" and hub.source["kind"] == "hub"
    assert _run(hub, GENERATE[0]).sequences.tolist() == GENERATE[0]["expected_output_ids"]


@pytest.mark.parametrize("key,value", [("shared_expert_intermediate_size", 32), ("moe_router_enable_expert_bias", True),
                                       ("partial_rotary_factor", 0.5), ("qk_layernorm", False)])
def test_options_qwen3_moe_cannot_express_are_refused(tmp_path, key, value):
    folder = with_model_type(tmp_path, "llada")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, key: value}))
    with pytest.raises(ValueError, match=key):
        sinklens.load(folder)


# --- bfloat16: against the official code loaded in bfloat16 (fixtures/lladamoe/cases_bf16.json) --
BF16_META = json.loads((FIXTURE / "cases_bf16.json").read_text())
BF16 = BF16_META["cases"]
ON_FIXTURE_KERNELS = pytest.mark.fixture_kernels(BF16_META["kernels"])  # tests/_kernels.py
BF16_GENERATE = [c for c in BF16 if c["kind"] == "generate"]


@pytest.fixture(scope="module")
def m16():
    return sinklens.load(FIXTURE, dtype="bfloat16")


@pytest.mark.parametrize("capture", [False, True], ids=["plain", "capture"])
@pytest.mark.parametrize("case", ["forward_nopad", "forward_leftpad"])
@ON_FIXTURE_KERNELS
def test_bf16_logits_match_official(m16, case, capture):
    """Within one bfloat16 step (tests/_bf16.py), real positions only; capture (the lse route in
    half precision) changes nothing."""
    from _bf16 import assert_bf16_logits_close

    ref = load_file(str(FIXTURE / "logits_bf16.safetensors"))
    ids, mask = ref[f"{case}.input_ids"], ref.get(f"{case}.attention_mask")
    got = m16.forward_logits(ids, attention_mask=mask, attention=AttentionRequest(capture=True) if capture else None)
    assert m16.model.dtype == torch.bfloat16
    assert_bf16_logits_close(got, ref[f"{case}.logits"], real=None if mask is None else mask.bool())


@pytest.mark.parametrize("capture", [False, True], ids=["plain", "capture"])
@pytest.mark.parametrize("case", BF16_GENERATE, ids=[c["name"] for c in BF16_GENERATE])
@ON_FIXTURE_KERNELS
def test_bf16_generate_token_exact(m16, case, capture):
    assert _run(m16, case, CaptureOptions() if capture else None).sequences.tolist() == case["expected_output_ids"]


@ON_FIXTURE_KERNELS
def test_bf16_traced_and_untraced_are_token_identical(m16, tmp_path):
    case = next(c for c in BF16_GENERATE if c["name"] == "bf16_generate_leftpad")
    plain = _run(m16, case)
    traced = _run(m16, case, trace=tmp_path / "moe16.arrow")
    assert traced.sequences.tolist() == plain.sequences.tolist() == case["expected_output_ids"]
