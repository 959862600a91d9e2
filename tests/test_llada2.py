"""LLaDA2.0 / LLaDA2.1 against the official code (tests/fixtures/llada2: a tiny random float32
checkpoint in the official format with a non-zero expert bias, and what the official modeling
files computed on it; provenance in its README):

- forward logits of both official files, bidirectional and under generate()'s block-causal mask,
  == sinklens' Glm4Moe-based load within 1e-4;
- every official generate case token-exact, with and without capture (a trace), with the same
  number of forwards, each step's canvas the official forward's input;
- LLaDA2.1's edited flags are exactly the non-mask tokens that changed between forwards;
- traced and untraced generations are token-identical; the trace's layout is block-causal and
  invisible keys (later blocks) receive exactly 0;
- the checkpoint loads by hub id from an offline cache laid out like the hub; bad configs are
  refused in one line.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

import sinklens
from sinklens.samplers import CaptureOptions

torch.set_num_threads(1)

FIXTURES = Path(__file__).parent / "fixtures" / "llada2"
CASES = json.loads((FIXTURES / "cases.json").read_text())["cases"]
GENERATE = [c for c in CASES if c["kind"] == "generate"]
SAMPLER = {"llada2": "llada2", "llada21": "llada21"}


@pytest.fixture(scope="module")
def model():
    return sinklens.load(FIXTURES)


def test_loads_onto_glm4_moe(model):
    from transformers import Glm4MoeForCausalLM

    assert model.family.name == "llada2" and isinstance(model.model, Glm4MoeForCausalLM)
    assert (model.mask_id, model.eos_id) == (158, 157)
    gate = model.model.model.layers[1].mlp.gate
    assert gate.e_score_correction_bias.abs().min() > 0  # the official expert bias arrived
    assert model.model.config.rope_parameters["partial_rotary_factor"] == 0.5


@pytest.mark.parametrize("case", [c for c in CASES if c["kind"] == "forward"], ids=lambda c: c["name"])
def test_forward_logits_equal_official(model, case):
    want = load_file(FIXTURES / "logits.safetensors")[f"{case['name']}.logits"]
    ids = torch.tensor(case["input_ids"])
    if case["attention"] == "bidirectional":
        got = model.forward_logits(ids)
    else:
        got = model.family.ops.window_logits(model, ids, case["block_length"])
    assert (got - want).abs().max().item() <= 1e-4


def run(model, case, **kw):
    return model.generate(torch.tensor(case["input_ids"]), sampler=SAMPLER[case["model"]], **case["arguments"], **kw)


@pytest.mark.parametrize("case", GENERATE, ids=lambda c: c["name"])
def test_generate_equals_official_with_and_without_capture(model, case, tmp_path):
    P = len(case["input_ids"][0])
    plain = run(model, case)
    traced = run(model, case, trace=tmp_path / "t.arrow", capture=CaptureOptions(received_dtype="float32"))
    for out in (plain, traced):
        assert out.sequences[:, P:].tolist() == case["expected_output_ids"]
        assert out.num_steps == len(case["forward_inputs"])
    assert torch.equal(plain.sequences, traced.sequences)  # capture changes nothing
    t = sinklens.open_trace(traced.trace_path)
    assert t.num_steps == len(case["forward_inputs"])
    for step, fed in zip(t.steps, case["forward_inputs"]):
        assert t.tokens(step).tolist() == fed  # each step's canvas is the official forward's input
        rows = len(t.query_positions(step))
        np.testing.assert_allclose(t.received(step).sum(-1), rows, rtol=1e-4)  # every window row summed
    editing = case["model"] == "llada21"
    assert all((t.edited(s) is not None) == editing for s in t.steps)


def test_edited_flags_are_the_rewritten_tokens(model, tmp_path):
    case = next(c for c in GENERATE if c["name"] == "v21_edit_low")
    mask = case["arguments"]["mask_id"]
    out = run(model, case, trace=tmp_path / "e.arrow")
    t = sinklens.open_trace(out.trace_path)
    n_edits = 0
    for i, step in enumerate(t.steps):
        before = np.array(case["forward_inputs"][i])  # the window the official forward got
        after = out.history[i][0, : len(before)].numpy()  # the canvas after this step
        changed = before != after
        edited, revealed = t.edited(step), t.revealed(step)
        np.testing.assert_array_equal(edited, changed & (before != mask))
        np.testing.assert_array_equal(revealed, changed & (before == mask))
        n_edits += int(edited.sum())
    assert n_edits > 0  # the case does edit
    from sinklens.analysis import analyze

    a = analyze(t)
    assert a.edited is not None and int(a.edited.sum()) == n_edits
    assert sum(a.to_dict()["edited_per_step"]) == n_edits


def test_trace_layout_is_block_causal_and_later_blocks_receive_nothing(model, tmp_path):
    case = next(c for c in GENERATE if c["name"] == "v20_basic")
    out = run(model, case, trace=tmp_path / "b.arrow", capture=CaptureOptions(received_dtype="float32"))
    from sinklens.analysis.source import as_source

    src = as_source(out.trace_path)
    bl = case["arguments"]["block_length"]
    assert src.layout.attention_block == bl and not src.layout.causal and src.layout.query_rows == "all"
    assert src.layout.prompt_length == len(case["input_ids"][0])
    lengths = {len(src.step_data(i).tokens) for i in range(src.num_steps)}
    assert len(lengths) > 1  # the window grows block by block
    # one query row of a middle block: keys of later blocks get exactly 0 (its attention map)
    ids = torch.tensor(case["input_ids"])
    req = sinklens.attention.AttentionRequest(map_slices=((0, 0),))
    S = 12
    window = torch.cat([ids, torch.full((1, S - ids.shape[1]), 158)], dim=1)
    model.family.ops.window_logits(model, window, bl, attention=req)
    A = req.maps[(0, 0)][0]  # (S, S)
    blocks = torch.arange(S) // bl
    later = blocks[None, :] > blocks[:, None]
    assert A[later].abs().max() == 0 and (A[~later] > 0).all()


def test_traced_and_untraced_generations_are_token_identical(model, tmp_path):
    ids = torch.randint(0, 157, (1, 9), generator=torch.Generator().manual_seed(3))
    for sampler, kw in (("llada2", dict(threshold=0.5)), ("llada21", dict(threshold=0.5, editing_threshold=0.3))):
        a = model.generate(ids, sampler=sampler, gen_length=20, block_length=4, steps=4, **kw)
        b = model.generate(ids, sampler=sampler, gen_length=20, block_length=4, steps=4, **kw,
                           trace=tmp_path / f"{sampler}.arrow")
        assert torch.equal(a.sequences, b.sequences) and a.num_steps == b.num_steps


def test_editing_threshold_none_turns_editing_off(model):
    ids = torch.randint(0, 157, (1, 6), generator=torch.Generator().manual_seed(4))
    out = model.generate(ids, sampler="llada21", gen_length=8, block_length=4, editing_threshold=None,
                         max_post_steps=2)
    seq = out.sequences[0].tolist()
    for before, after in zip(out.history, out.history[1:]):
        committed = (before != 158) & (before != after)
        assert not committed[0, 6:].any()  # no committed generated token ever changes
    assert 158 not in seq[6:]


def test_by_hub_id_from_offline_cache(tmp_path, monkeypatch):
    import huggingface_hub.constants as hf_constants

    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "hub" / "models--inclusionAI--LLaDA2.0-mini"
    snap = repo / "snapshots" / commit
    snap.mkdir(parents=True)
    for f in ("config.json", "model.safetensors"):
        shutil.copy(FIXTURES / f, snap / f)
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", True)
    m = sinklens.load("inclusionAI/LLaDA2.0-mini")
    assert m.family.name == "llada2" and m.source["kind"] == "hub"
    ids = torch.tensor(CASES[0]["input_ids"])
    want = load_file(FIXTURES / "logits.safetensors")["llada2_forward_bidirectional.logits"]
    assert (m.forward_logits(ids) - want).abs().max().item() <= 1e-4


@pytest.mark.parametrize("change, message", [
    ({"use_bias": True}, "use_bias=True is not supported"),
    ({"num_shared_experts": 0}, "without routed or shared experts"),
    ({"rope_scaling": {"type": "linear", "factor": 2.0}}, "rope_scaling="),
])
def test_unsupported_configs_are_refused_in_one_line(tmp_path, change, message):
    folder = tmp_path / "m"
    folder.mkdir()
    config = {**json.loads((FIXTURES / "config.json").read_text()), **change}
    (folder / "config.json").write_text(json.dumps(config))
    shutil.copy(FIXTURES / "model.safetensors", folder / "model.safetensors")
    with pytest.raises(ValueError, match=message) as e:
        sinklens.load(folder)
    assert "\n" not in str(e.value)


def test_batches_and_padding_are_refused(model):
    with pytest.raises(ValueError, match="one prompt at a time"):
        model.generate(torch.zeros(2, 4, dtype=torch.long), sampler="llada2", gen_length=4, block_length=4)


def test_sampler_flag_runs_llada21_from_the_command_line(capsys):
    """`--sampler llada21` on generate reaches LLaDA2.1's editing sampler: the official Q-mode case
    token for token; a sampler the family does not run, or no sampler at all, is one line, exit 2."""
    from sinklens.cli import main

    case = next(c for c in GENERATE if c["model"] == "llada21")
    a = case["arguments"]
    flags = ["--gen-length", str(a["gen_length"]), "--block-length", str(a["block_length"]), "--steps",
             str(a["steps"]), "--threshold", str(a["threshold"]), "--editing-threshold", str(a["editing_threshold"]),
             "--max-post-steps", str(a["max_post_steps"]), "--temperature", str(a["temperature"])]
    ids = ",".join(map(str, case["input_ids"][0]))
    assert main(["generate", "--model", str(FIXTURES), "--input-ids", ids, "--sampler", "llada21", *flags,
                 "--json", "-q"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["generated_ids"] == case["expected_output_ids"][0]
    for bad, said in (("sdar", "does not run family"), ("nope", "expected one of")):
        assert main(["generate", "--model", str(FIXTURES), "--input-ids", ids, "--sampler", bad, "-q"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"--sampler {bad!r}" in err[0] and said in err[0], err

# --- bfloat16: against the official files loaded in bfloat16 (fixtures/llada2/cases_bf16.json) --
# There generate()'s bfloat16 0/-inf mask meets bfloat16 queries: the official path, no cast.
BF16_META = json.loads((FIXTURES / "cases_bf16.json").read_text())
BF16 = BF16_META["cases"]
ON_FIXTURE_KERNELS = pytest.mark.fixture_kernels(BF16_META["kernels"])  # tests/_kernels.py
BF16_GENERATE = [c for c in BF16 if c["kind"] == "generate"]


@pytest.fixture(scope="module")
def model16():
    return sinklens.load(FIXTURES, dtype="bfloat16")


@pytest.mark.parametrize("capture", [False, True], ids=["plain", "capture"])
@pytest.mark.parametrize("case", [c for c in BF16 if c["kind"] == "forward"], ids=lambda c: c["name"])
@ON_FIXTURE_KERNELS
def test_bf16_logits_equal_official(model16, case, capture):
    """Within one bfloat16 step (tests/_bf16.py): the experts' outputs mixed in float32 as the
    official moe_infer does; capture (the lse route in half precision) changes nothing."""
    from _bf16 import assert_bf16_logits_close

    want = load_file(FIXTURES / "logits_bf16.safetensors")[f"{case['name']}.logits"]
    ids = torch.tensor(case["input_ids"])
    req = sinklens.attention.AttentionRequest(capture=True) if capture else None
    if case["attention"] == "bidirectional":
        got = model16.forward_logits(ids, attention=req)
    else:
        got = model16.family.ops.window_logits(model16, ids, case["block_length"], attention=req)
    assert model16.model.dtype == torch.bfloat16
    assert_bf16_logits_close(got, want)


@pytest.mark.parametrize("case", BF16_GENERATE, ids=lambda c: c["name"])
@ON_FIXTURE_KERNELS
def test_bf16_generate_equals_official_with_and_without_capture(model16, case, tmp_path):
    P = len(case["input_ids"][0])
    plain = run(model16, case)
    traced = run(model16, case, trace=tmp_path / "t16.arrow", capture=CaptureOptions(received_dtype="float32"))
    for out in (plain, traced):
        assert out.sequences[:, P:].tolist() == case["expected_output_ids"]
        assert out.num_steps == len(case["forward_inputs"])
    assert torch.equal(plain.sequences, traced.sequences)
    t = sinklens.open_trace(traced.trace_path)
    assert [t.tokens(s).tolist() for s in t.steps] == case["forward_inputs"]
