"""Fast-dLLM's cached decoding as options of the llada sampler (cache=prefix|dual, threshold).

Reference: tests/fixtures/fastdllm, written by NVlabs/Fast-dLLM's own llada/generate.py +
modeling_llada.py and dream/model/generation_utils_block.py + modeling_dream.py on the official
tiny LLaDA and Dream checkpoints (../shared/fixtures/reference/{llada,dream}).
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch

import sinklens
from sinklens.attention import AttentionRequest
from sinklens.rule import np_rule
from sinklens.samplers import CaptureOptions
from sinklens.samplers.dream.config import DreamConfig
from sinklens.samplers.llada.config import LLaDAConfig
from sinklens.trace.layout import TraceLayout

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "fastdllm"
META = json.loads((FIXTURE / "cases.json").read_text())
CASES = META["cases"]
LLADA = [c for c in CASES if c["family"] == "llada"]
DREAM = [c for c in CASES if c["family"] == "dream"]
CACHE_OF = {"generate": "none", "generate_with_prefix_cache": "prefix", "generate_with_dual_cache": "dual"}

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def models(fixtures_dir):
    return {name: sinklens.load(fixtures_dir / name) for name in ("llada", "dream")}


@pytest.fixture(scope="module")
def m(models):
    return models["llada"]


def official_kwargs(case) -> dict:
    """sinklens' arguments for an official call."""
    args = dict(case["arguments"], mask_id=case["mask_id"])
    if case["family"] == "llada":
        return dict(args, cache=CACHE_OF[case["function"].split(":")[1]])
    if "dual_cache" in args:  # generation_utils_block.py; else generation_utils.py: no cache
        args["cache"] = "dual" if args.pop("dual_cache") else "prefix"
    if args["alg"] == "confidence_threshold":  # Fast-dLLM's alg name for its threshold decoding,
        del args["alg"]                        # which reads no alg_temp
        args.pop("alg_temp", None)
    return args


def _run(m, case, capture=None, **extra):
    torch.manual_seed(case["seed"])
    return m.generate(torch.tensor(case["input_ids"]), capture=capture, **official_kwargs(case), **extra)


def _case(name):
    return next(c for c in CASES if c["name"] == name)


@pytest.mark.parametrize("capture", [False, True], ids=["plain", "capture"])
@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_generate_token_exact(models, case, capture):
    out = _run(models[case["family"]], case, CaptureOptions() if capture else None)
    assert out.sequences.tolist() == case["expected_output_ids"]
    assert out.num_steps == len(out.history) == case["nfe"]  # one step per official forward


def test_dream_one_step_per_block_keeps_its_masks(models):
    """As the official loop: with one step per block, the step after the refresh commits nothing
    and the block keeps its [MASK] ids (all but the block's first position)."""
    case = _case("dream_one_step_per_block")
    out = _run(models["dream"], case).sequences[0].tolist()
    P, bl = len(case["input_ids"][0]), case["arguments"]["block_length"]
    for start in range(P, len(out), bl):
        assert out[start] != 300 and out[start + 1:start + bl] == [300] * (bl - 1)


def test_the_cache_is_read_not_recomputed(m):
    """A cached step's logits are not those of a full forward of the same canvas: the stored
    keys come from the refreshing forward (dual: a suffix of masks seen before the block changed).
    And the cached runs differ from the uncached decoding somewhere among the cases."""
    logits = []
    case = _case("llada_dual_b4")
    _run(m, case, hook=lambda ev: logits.append((ev.tokens.clone(), ev.query_positions[0], ev.logits)))
    tokens, rows, cached = logits[1]                          # block 0, step 1: the block's rows only
    assert rows.tolist() == list(range(10, 14))
    full = m.forward_logits(tokens)[:, rows]
    assert (full - cached).abs().max().item() > 1e-5
    differ = 0
    for c in LLADA:
        if official_kwargs(c)["cache"] != "none":
            torch.manual_seed(c["seed"])
            plain = m.generate(torch.tensor(c["input_ids"]), **dict(official_kwargs(c), cache="none"))
            differ += plain.sequences.tolist() != c["expected_output_ids"]
    assert differ > 0


@pytest.mark.parametrize("name,mode", [("llada_prefix_b8_threshold", "prefix"), ("llada_dual_b8_threshold", "dual"),
                                       ("dream_prefix_entropy_b4", "prefix"), ("dream_dual_threshold_b4", "dual")])
def test_trace_records_computed_rows_and_visible_cached_keys(models, tmp_path, name, mode):
    case = _case(name)
    m = models[case["family"]]
    plain = _run(m, case)
    traced = _run(m, case, trace=tmp_path / "fast.arrow")
    assert traced.sequences.tolist() == plain.sequences.tolist() == case["expected_output_ids"]
    t = sinklens.open_trace(traced.trace_path)
    layout = TraceLayout.from_meta(t.meta)
    P, S, bl = len(case["input_ids"][0]), t.seq_len, case["arguments"]["block_length"]
    assert t.meta["sampler"]["args"]["cache"] == mode and layout.query_rows == "block"
    refreshes = 0
    for step in range(t.num_steps):
        q = t.query_positions(step)
        received = t.received(step)                            # (L, H, S): every canvas position is a key
        assert received.shape[-1] == S
        # each computed row spreads 1 over the keys: the column sums add up to the number of rows
        np.testing.assert_allclose(received.sum(-1), len(q), rtol=2e-3)
        if len(q) == S:                                        # the refreshing forward of a block
            refreshes += 1
            continue
        start = int(q[0])
        end = S if mode == "prefix" else start + bl
        assert q.tolist() == list(range(start, end)) and (start - P) % bl == 0
        assert (received[..., :start] > 0).all()               # cached prefix keys are seen
        if mode == "dual" and end < S:
            assert (received[..., end:] > 0).all()             # so is the cached suffix
        cov = np_rule.coverage(q, np.ones(S, bool), layout.visibilities(t.num_layers))
        assert cov.visible.all() and (cov.n_queries == len(q)).all()  # the rule counts cached keys as visible
    assert refreshes == (S - P) // bl  # one per block


class BlockOne:
    """A hook that blocks one key for every head and layer, and records what the keys received."""

    wants_attention = True

    def __init__(self, m, pos: int | None, keep_self: bool = False):
        self.m, self.pos, self.keep_self = m, pos, keep_self
        self.received, self.logits, self.rows = [], [], []

    def before_step(self, step, tokens, is_masked):
        req = AttentionRequest(capture=True, keep_self=self.keep_self)
        if self.pos is not None:
            req.blocked = torch.zeros(self.m.num_layers, 1, self.m.num_heads, tokens.shape[1], dtype=torch.bool)
            req.blocked[..., self.pos] = True
        return req

    def after_step(self, event):
        self.received.append(event.attention.received)          # (L, 1, H, S)
        self.logits.append(event.logits)
        self.rows.append(event.query_positions[0])


@pytest.mark.parametrize("family", ["llada", "dream"])
@pytest.mark.parametrize("cache", ["prefix", "dual"])
def test_a_blocked_cached_key_stays_blocked_for_the_computed_rows(models, family, cache):
    """A prompt key (cached at every step after a block's first) receives exactly 0 from the
    computed rows when blocked, and the logits change; unblocked it is seen."""
    m = models[family]
    ids = torch.randint(0, 298, (1, 9), generator=torch.Generator().manual_seed(5))
    length = dict(gen_length=8) if family == "llada" else dict(max_new_tokens=8, alg="entropy")
    kw = dict(block_length=4, steps=4, mask_id=300, cache=cache, **length)
    on, off = BlockOne(m, 3), BlockOne(m, None)
    m.generate(ids, hook=on, **kw)
    m.generate(ids, hook=off, **kw)
    cached_steps = [i for i, q in enumerate(on.rows) if len(q) < ids.shape[1] + 8]
    assert cached_steps
    for i in cached_steps:
        assert float(on.received[i][..., 3].abs().max()) == 0.0
        assert float(off.received[i][..., 3].min()) > 0.0
    assert (on.logits[1] - off.logits[1]).abs().max().item() > 1e-4


@pytest.mark.parametrize("family", ["llada", "dream"])
def test_keep_self_with_the_dual_cache_is_refused(models, family):
    m = models[family]
    ids = torch.tensor([[5, 6, 7]])
    kw = dict(gen_length=4) if family == "llada" else dict(max_new_tokens=4, alg="entropy")
    kw |= dict(block_length=4, steps=4, mask_id=300)
    with pytest.raises(ValueError, match="keep_self masking cannot be combined with cache='dual'"):
        m.generate(ids, cache="dual", hook=BlockOne(m, 1, True), **kw)
    # the prefix cache keeps the queries last, so keep_self is exact there
    m.generate(ids, cache="prefix", hook=BlockOne(m, 1, True), **kw)


def test_defaults_keep_llada_generate(m, fixtures_dir):
    """No cache, no threshold: LLaDA's own generate(), still token-exact with its official cases."""
    assert not LLaDAConfig().fast_dllm and DreamConfig().cache == "none"
    cases = json.loads((fixtures_dir / "llada" / "cases.json").read_text())["cases"]
    case = next(c for c in cases if c["name"] == "generate_semi_ar")
    args = {k: v for k, v in case["arguments"].items() if k != "prompt"}  # "prompt" there is a placeholder
    out = m.generate(torch.tensor(case["input_ids"]), **args)
    assert out.sequences.tolist() == case["expected_output_ids"]


@pytest.mark.parametrize("kwargs,message", [
    (dict(cache="prefix", cfg_scale=1.0), "cfg_scale=1.0 cannot be combined with cache='prefix'"),
    (dict(threshold=0.5, logits_eos_inf=True), "Fast-dLLM's decoding has no logits_eos_inf"),
    (dict(cache="dual", steps=2, block_length=4, gen_length=8), "at least 2 steps per block"),
    (dict(threshold=1.5), "threshold"),
    (dict(cache="full"), "cache"),
])
def test_bad_settings_are_one_clear_error(m, kwargs, message):
    args = dict(gen_length=8, block_length=4, steps=8, mask_id=300) | kwargs
    with pytest.raises(ValueError, match=message):
        m.generate(torch.tensor([[1, 2, 3]]), **args)


@pytest.mark.parametrize("kwargs,message", [
    (dict(block_length=4), "block_length=4 needs cache='prefix' or 'dual'"),
    (dict(threshold=0.5, steps=3, max_new_tokens=8), "multiple of steps"),
    (dict(cache="prefix", alg="maskgit_plus", block_length=4), "ranks by entropy whatever alg says"),
    (dict(cache="dual", block_length=3), "multiple of block_length"),
    (dict(cache="prefix", block_length=4, steps=3, alg="entropy"), "divisible by the number of blocks"),
])
def test_dream_bad_settings_are_one_clear_error(models, kwargs, message):
    args = dict(max_new_tokens=8, steps=8, mask_id=300) | kwargs
    with pytest.raises(ValueError, match=message):
        models["dream"].generate(torch.tensor([[1, 2, 3]]), **args)


def test_dream_batch_rules(models):
    """A batch runs with the prefix cache and no threshold (the official _sample handles it: see the
    dream_prefix_batch2 cases); the dual cache and the threshold take one prompt; padding is refused."""
    d = models["dream"]
    two = torch.tensor([[1, 2, 3], [4, 5, 6]])
    kw = dict(max_new_tokens=4, steps=4, block_length=4, mask_id=300)
    with pytest.raises(ValueError, match="one prompt at a time"):
        d.generate(two, cache="dual", alg="entropy", **kw)
    with pytest.raises(ValueError, match="one prompt at a time"):
        d.generate(two, cache="prefix", threshold=0.5, **kw)
    with pytest.raises(ValueError, match="one prompt at a time"):
        d.generate(two, max_new_tokens=4, steps=4, mask_id=300, threshold=0.5)
    with pytest.raises(ValueError, match="no padding"):
        d.generate(two, attention_mask=torch.tensor([[0, 1, 1], [1, 1, 1]]), cache="prefix", alg="entropy", **kw)


def test_batch_and_padding_are_refused(m):
    kw = dict(gen_length=4, block_length=4, steps=4, mask_id=300, cache="prefix")
    with pytest.raises(ValueError, match="one prompt at a time"):
        m.generate(torch.tensor([[1, 2, 3], [4, 5, 6]]), **kw)
    with pytest.raises(ValueError, match="no padding"):
        m.generate(torch.tensor([[1, 2, 3]]), attention_mask=torch.tensor([[0, 1, 1]]), **kw)


def test_cli_help_lists_the_options():
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "sinklens.cli", "generate", "--help"], capture_output=True, text=True,
                         cwd=Path(__file__).resolve().parents[1], check=True).stdout
    assert "--cache {none,prefix,dual}" in out and "--threshold X" in out


def test_a_cache_needs_bidirectional_attention(m, monkeypatch):
    """The cached forwards pass no mask: right only for a bidirectional model. A family with any
    other attention layout is refused in one line rather than decoded with the wrong keys."""
    monkeypatch.setattr(m, "family", dataclasses.replace(m.family, attention="causal"))
    with pytest.raises(ValueError, match="needs bidirectional attention"):
        m.generate(torch.tensor([[1, 2, 3]]), gen_length=4, block_length=4, steps=4, mask_id=300, cache="prefix")

