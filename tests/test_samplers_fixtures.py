"""Samplers against the official LLaDA / Dream code: every generate case of
../shared/fixtures/reference/{llada,dream}/cases.json token for token, per-step history included,
with and without attention capture (a trace must not change a single token)."""
import json

import numpy as np
import pytest
import torch

import sinklens
from sinklens.samplers import CaptureOptions

torch.set_num_threads(1)  # tiny models: threads only contend on the shared 2-core machine

SKIP_ARGS = {"prompt", "inputs", "attention_mask", "output_history", "return_dict_in_generate"}


def _cases(fixtures_dir, family):
    return [c for c in json.loads((fixtures_dir / family / "cases.json").read_text())["cases"] if c["kind"] == "generate"]


def _case_ids(family):
    from conftest import FIXTURES

    path = FIXTURES / family / "cases.json"
    if not path.is_file():
        return []
    return [c["name"] for c in json.loads(path.read_text())["cases"] if c["kind"] == "generate"]


@pytest.fixture(scope="module")
def models(fixtures_dir):
    return {f: sinklens.load(fixtures_dir / f) for f in ("llada", "dream")}


def _run(model, case, **kw):
    args = {k: v for k, v in case["arguments"].items() if k not in SKIP_ARGS}
    ids = torch.tensor(case["input_ids"])
    am = None if case["attention_mask"] is None else torch.tensor(case["attention_mask"])
    if case["seed"] is not None:  # the READMEs document the RNG draw order; seed right before the call
        torch.manual_seed(case["seed"])
    return model.generate(ids, am, **args, **kw)


# Without the fixtures one placeholder case remains, so `fixtures_dir` skips it (fails under CI).
CASES = [("llada", n) for n in _case_ids("llada")] + [("dream", n) for n in _case_ids("dream")] or [("llada", "missing")]


@pytest.mark.parametrize("family,name", CASES)
def test_equals_official_sampler(models, fixtures_dir, family, name):
    case = next(c for c in _cases(fixtures_dir, family) if c["name"] == name)
    out = _run(models[family], case)
    assert out.sequences.tolist() == case["expected_output_ids"]
    assert [h.tolist() for h in out.history] == case["history"]


@pytest.mark.parametrize("family,name", CASES)
def test_capture_changes_no_token_and_trace_is_consistent(models, fixtures_dir, tmp_path, family, name):
    case = next(c for c in _cases(fixtures_dir, family) if c["name"] == name)
    capture = CaptureOptions(map_slices=((1, 2),), map_steps=(0, 3), query_chunk=7)
    out = _run(models[family], case, trace=tmp_path / "t.arrow", capture=capture)
    assert out.sequences.tolist() == case["expected_output_ids"]
    assert [h.tolist() for h in out.history] == case["history"]

    t = sinklens.open_trace(out.trace_path)
    m = models[family]
    assert not t.truncated and t.num_steps == len(case["history"])
    assert (t.num_layers, t.num_heads, t.batch_size) == (m.num_layers, m.num_heads, 2)
    assert t.meta["family"] == family and t.meta["query_groups"] == ["masked", "unmasked"]
    assert t.meta["sampler"]["args"]["steps"] == case["arguments"]["steps"]
    am = np.ones((2, t.seq_len), bool)
    if case["attention_mask"] is not None:
        am[:, : len(case["attention_mask"][0])] = np.array(case["attention_mask"], bool)
    for step in t.steps:
        for row in range(2):
            before = np.array(case["history"][step - 1][row]) if step else t.tokens(0, row)
            after = np.array(case["history"][step][row])
            np.testing.assert_array_equal(t.tokens(step, row), before)  # the canvas fed at this step
            np.testing.assert_array_equal(t.is_masked(step, row), before == m.mask_id)
            changed = before != after
            assert not (changed & ~t.revealed(step, row)).any()  # every change was a committed position
            np.testing.assert_array_equal(t.attention_mask(step, row), am[row])
            rec = t.received(step, row)  # (L, H, S): every real query row spends exactly 1
            np.testing.assert_allclose(rec.sum(-1), am[row].sum(), rtol=2e-3)
            assert (rec[:, :, ~am[row]] == 0).all()  # padded keys receive nothing
            groups = t.received_groups(step, row)  # masked + unmasked queries = all real queries
            np.testing.assert_allclose(groups.sum(0), rec, atol=0.02)
            np.testing.assert_allclose(groups[0].sum(-1), (t.is_masked(step, row) & am[row]).sum(), rtol=2e-3)
    amap = t.map(3, 1, 2, row=1)  # (S_q, S_k) rows of real queries are distributions
    np.testing.assert_allclose(amap[am[1]].sum(-1), 1, atol=1e-5)
    with pytest.raises(KeyError):
        t.map(1, 1, 2)  # maps only at the requested steps


def test_hook_sees_every_step_and_can_block_keys(models, fixtures_dir):
    case = next(c for c in _cases(fixtures_dir, "llada") if c["name"] == "generate_semi_ar")
    m = models["llada"]
    L, H = m.num_layers, m.num_heads

    class BlockFirstKey:
        wants_attention = True

        def __init__(self):
            self.events = []

        def before_step(self, step, tokens, is_masked):
            blocked = torch.zeros(L, tokens.shape[0], H, tokens.shape[1], dtype=torch.bool)
            blocked[:, :, :, 0] = True
            return sinklens.attention.AttentionRequest(blocked=blocked)

        def after_step(self, event):
            self.events.append(event)

    hook = BlockFirstKey()
    out = _run(m, case, hook=hook)
    assert [e.step for e in hook.events] == list(range(16))
    assert [e.block for e in hook.events[:5]] == [(8, 12)] * 4 + [(12, 16)]
    rec = hook.events[5].attention.received  # (L, B, H, S)
    assert rec.shape == (L, 2, H, 24) and float(rec[..., 0].abs().max()) == 0.0
    assert out.sequences.shape == (2, 24)


def test_cfg_without_attention_mask_runs_as_all_ones(models, fixtures_dir):
    """Official generate() raises UnboundLocalError here; sinklens treats None as an all-ones mask."""
    case = next(c for c in _cases(fixtures_dir, "llada") if c["name"] == "generate_cfg")
    args = {k: v for k, v in case["arguments"].items() if k not in SKIP_ARGS}
    out = models["llada"].generate(torch.tensor(case["input_ids"]), None, **args)
    assert out.sequences.tolist() == case["expected_output_ids"]


@pytest.mark.parametrize("kwargs,match", [
    (dict(gen_length=16, block_length=5, steps=16), r"gen_length \(16\) must be a multiple of block_length \(5\)"),
    (dict(gen_length=16, block_length=4, steps=6), r"steps \(6\) must be divisible by the number of blocks"),
    (dict(gen_length=16, block_length=16, steps=16, remasking="greedy"), r"remasking must be one of"),
    (dict(gen_length=16, block_length=16, steps=16, temperature=-1.0), r"temperature must be >= 0"),
    (dict(gen_length=4090, block_length=4090, steps=4090), r"exceeds the model's context of 4096"),
    (dict(steps=16, max_new_tokens=16), r"unknown argument\(s\) \['max_new_tokens'\]"),
])
def test_llada_bad_inputs_fail_before_compute(models, kwargs, match):
    m = models["llada"]
    calls = []
    m.forward_logits, orig = (lambda *a, **k: calls.append(1)), m.forward_logits
    try:
        with pytest.raises((ValueError, TypeError), match=match):
            m.generate(torch.tensor([[1, 2, 3, 4, 5, 6, 7, 8]]), **kwargs)
    finally:
        m.forward_logits = orig
    assert not calls


@pytest.mark.parametrize("kwargs,match", [
    (dict(alg="greedy"), r"alg must be one of \['origin', 'maskgit_plus', 'topk_margin', 'entropy'\], got 'greedy'"),
    (dict(steps=0), r"steps must be a positive integer"),
    (dict(max_new_tokens=200_000), r"exceeds the model's context"),
    (dict(top_p=1.5), r"top_p must be in"),
    (dict(gen_length=16), r"unknown argument\(s\) \['gen_length'\]"),
])
def test_dream_bad_inputs_fail_before_compute(models, kwargs, match):
    with pytest.raises((ValueError, TypeError), match=match):
        models["dream"].generate(torch.tensor([[1, 2, 3]]), **kwargs)


def test_bad_attention_mask_shape(models):
    with pytest.raises(ValueError, match="attention_mask must have the shape of input_ids"):
        models["llada"].generate(torch.tensor([[1, 2, 3]]), torch.ones(1, 4), steps=4, gen_length=4, block_length=4)


def test_interrupted_generation_keeps_finished_steps(models, fixtures_dir, tmp_path):
    case = next(c for c in _cases(fixtures_dir, "dream") if c["name"] == "generate_entropy")

    def stop_at_step_5(event):
        if event.step == 5:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        _run(models["dream"], case, trace=tmp_path / "t.arrow", hook=stop_at_step_5)
    t = sinklens.open_trace(tmp_path / "t.arrow")
    assert t.truncated and t.steps == [0, 1, 2, 3, 4]  # the writer runs after the user's hook
    np.testing.assert_array_equal(t.tokens(4, 1), case["history"][3][1])


@pytest.mark.slow
def test_logits_eos_inf_uses_the_models_eos_id(models):
    """The fixture's EOS is 299 (config), not the 8B vocabulary's 126081 that the official code hard-codes."""
    m = models["llada"]
    assert m.eos_id == 299
    ids = torch.tensor([[211, 1, 253, 10, 223, 270, 20, 73], [23, 272, 293, 125, 70, 59, 186, 81]])
    kw = dict(steps=32, gen_length=32, block_length=32, temperature=2.0)
    plain, suppressed = 0, 0
    for seed in range(5):
        torch.manual_seed(seed)
        plain += int((m.generate(ids, **kw).sequences[:, 8:] == 299).sum())
        torch.manual_seed(seed)
        suppressed += int((m.generate(ids, logits_eos_inf=True, **kw).sequences[:, 8:] == 299).sum())
    assert plain > 0 and suppressed == 0
