"""SDAR's prefill and store forwards are not trace steps; what they computed is one block-causal
forward over the final canvas (docs/samplers.md, "SDAR").

SDAR's sampler runs three kinds of forward: the prefill (the prompt's whole blocks, stored into the
KV cache), the denoising forwards of the active block (read the cache, store nothing: these are
the trace's steps) and one store forward per finished block. The prefill's queries are the prompt
blocks, each store forward's the finished block over the cache + itself, and cached keys are
always the blocks' final tokens: so their rows together are the rows of one forward of the final
canvas under the block-causal mask. A user who wants that attention runs that one forward
(`m.forward_logits(out.sequences, attention=AttentionRequest(capture=True))`); this test holds the
equivalence, and that the trace holds exactly the denoising forwards."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import sinklens
from sinklens.attention import AttentionRequest

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "sdar"

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def m():
    return sinklens.load(FIXTURE)


def test_prefill_and_store_forwards_are_one_forward_of_the_final_canvas(m, monkeypatch, tmp_path):
    assert m.attention_layout["attention_block"] == 4        # forward_logits' blocks = the sampler's below
    ops = m.family.ops
    real = ops.forward_block
    calls = []

    def spy(model, tokens, start, cache, *, store, block, attention=None):
        logits = real(model, tokens, start, cache, store=store, block=block, attention=attention)
        calls.append((start, tokens.shape[1], store, logits.float()))
        return logits

    monkeypatch.setattr(ops, "forward_block", spy)
    ids = torch.randint(0, 298, (1, 10), generator=torch.Generator().manual_seed(5))   # 2 whole blocks + 2
    torch.manual_seed(0)
    out = m.generate(ids, gen_length=10, block_length=4, denoising_steps=4, top_k=1, stopping_criteria_idx=[],
                     trace=tmp_path / "sdar.arrow")
    final = out.sequences                                      # (1, 20): 5 blocks, every one finished
    stored = [(s, n, logits) for s, n, store, logits in calls if store]
    assert [(s, n) for s, n, _ in stored] == [(0, 8), (8, 4), (12, 4), (16, 4)]   # prefill, then each block

    full = m.forward_logits(final, attention=AttentionRequest(capture=True)).float()   # (1, 20, V)
    for s, n, logits in stored:
        assert (logits - full[:, s:s + n]).abs().max().item() <= 1e-4

    # the trace: one record per denoising forward, each with the active block's rows as its queries
    denoise = [(s, n) for s, n, store, _ in calls if not store]
    t = out.trace
    assert t.num_steps == len(denoise) == out.num_steps
    for step, (s, n) in enumerate(denoise):
        assert t.query_positions(step).tolist() == list(range(s, s + n))
    assert t.meta["layout"]["query_rows"] == "block" and t.meta["layout"]["attention_block"] == 4


CASES = [c for c in json.loads((FIXTURE / "cases.json").read_text())["cases"] if c["kind"] == "generate"]


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_every_official_case_is_token_exact_while_traced(m, case, tmp_path):
    """With the trace writer on (capture of every denoising step, the masked / unmasked split), every
    official generate case still gives the official tokens, and the trace has one step per forward."""
    args = dict(case["arguments"])
    if args["stopping_criteria_idx"] is None:
        args["stopping_criteria_idx"] = []                              # the official function's default: never stop
    torch.manual_seed(case["seed"])
    out = m.generate(torch.tensor(case["input_ids"]), trace=tmp_path / "t.arrow", **args)
    assert out.sequences.tolist() == case["expected_output_ids"]
    assert out.trace.num_steps == out.num_steps
