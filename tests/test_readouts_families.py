"""Hidden-state readouts and the logit lens on the families whose samplers build their own
forwards (SDAR's KV-cached blocks, LLaDA2's block-causal windows, DiffusionGemma's decoder passes,
Fast-dLLM's prefix and dual caches of LLaDA and Dream): all reach the model through
`SinkModel.run_model`, so each traced step's readouts come from the forward that made its logits.

Reference: transformers' own `output_hidden_states` and logits of that same forward (asked for
with a forward pre-hook on the model, the documented `register_forward_pre_hook(with_kwargs=True)`,
read with a forward hook): the lens at the last layer is those logits (DiffusionGemma's soft-capped
ones; the samplers may rescale or shift theirs afterwards); the generated tokens with and without
readouts."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import sinklens
from test_diffusion_gemma import CASES as DG_CASES, build as build_dg, our_kwargs as dg_kwargs, prompt as dg_prompt
from test_fastdllm import CASES as FAST_CASES, official_kwargs as fast_kwargs

FIXTURES = Path(__file__).resolve().parent / "fixtures"

torch.set_num_threads(1)


class Probe:
    """Asks every step for hidden-state norms and a lens at the last layer over every position, and
    the same forward for transformers' hidden states; checks both when the step ends."""

    def __init__(self, m):
        self.m, self.L = m, m.num_layers
        self.outputs: dict[int, tuple] = {}                         # id(request) -> (hidden_states, logits)
        self.steps = self.lens_rows = 0
        self.handles = [m.model.register_forward_pre_hook(self._ask, with_kwargs=True),
                        m.model.register_forward_hook(self._keep, with_kwargs=True)]

    def _ask(self, module, args, kwargs):
        if getattr(kwargs.get("sinklens"), "hidden_norms", False):
            kwargs["output_hidden_states"] = True
        return args, kwargs

    def _keep(self, module, args, kwargs, output):
        if getattr(kwargs.get("sinklens"), "hidden_norms", False):
            self.outputs[id(kwargs["sinklens"])] = output.hidden_states, output.logits.float()

    def before_step(self, step, tokens, is_masked):
        from sinklens.attention import AttentionRequest

        return AttentionRequest(capture=True, hidden_norms=True, lens_layers=(self.L - 1,),
                                lens_positions=tuple(range(tokens.shape[1])))

    def after_step(self, event):
        req = event.attention
        hs, logits = self.outputs.pop(id(req))                      # embeddings + layer outputs; (B, n, V) computed rows
        norms = req.readout("hidden_norm")                          # (L, B, n)
        assert norms.shape == (self.L, logits.shape[0], logits.shape[1])
        for l in range(self.L - 1):                                 # the last entry of hidden_states is normed
            assert torch.allclose(norms[l], hs[l + 1].float().norm(dim=-1), rtol=1e-4, atol=1e-4), l
        pos, probs = req.lens["positions"], req.lens["probs"][:, 0]  # (B, P), (B, P, k)
        for b in range(pos.shape[0]):
            valid = pos[b][pos[b] >= 0]
            # the lens reads exactly the rows this forward computed, at their own positions (the
            # step's query positions; else the last rows of the step's tokens)
            n, S = logits.shape[1], event.tokens.shape[1]
            rows = range(S - n, S) if event.query_positions is None else event.query_positions[b]
            assert valid.tolist() == list(rows)
            want = logits[b].softmax(-1).topk(probs.shape[-1]).values       # (n, k) row by row
            assert torch.allclose(probs[b][pos[b] >= 0], want, atol=1e-4)
            self.lens_rows += len(valid)
        self.steps += 1

    def close(self):
        for h in self.handles:
            h.remove()


def check(m, run):
    """run(hook) -> GenerateOutput, seeded inside. Tokens equal with and without the readouts."""
    plain = run(None).sequences
    probe = Probe(m)
    try:
        traced = run(probe).sequences
    finally:
        probe.close()
    assert traced.tolist() == plain.tolist()
    assert probe.steps > 1 and probe.lens_rows >= probe.steps


def test_sdar_cached_blocks():
    m = sinklens.load(FIXTURES / "sdar")
    cases = json.loads((FIXTURES / "sdar" / "cases.json").read_text())["cases"]
    case = next(c for c in cases if c["kind"] == "generate")
    args = dict(case["arguments"], stopping_criteria_idx=case["arguments"]["stopping_criteria_idx"] or [])

    def run(hook):
        torch.manual_seed(case["seed"])
        return m.generate(torch.tensor(case["input_ids"]), hook=hook, **args)
    check(m, run)


@pytest.mark.parametrize("sampler", ["llada2", "llada21"])
def test_llada2_block_causal_windows(sampler):
    m = sinklens.load(FIXTURES / "llada2")
    cases = json.loads((FIXTURES / "llada2" / "cases.json").read_text())["cases"]
    case = next(c for c in cases if c["kind"] == "generate" and c["model"] == sampler)

    def run(hook):
        torch.manual_seed(0)
        return m.generate(torch.tensor(case["input_ids"]), sampler=sampler, hook=hook, **case["arguments"])
    check(m, run)


def test_diffusion_gemma_decoder(tmp_path):
    m = sinklens.load(build_dg(tmp_path / "dg"))
    ids = dg_prompt()

    def run(hook):
        torch.manual_seed(0)
        return m.generate(ids, hook=hook, **dg_kwargs(DG_CASES["defaults"]))
    check(m, run)


@pytest.mark.parametrize("name", ["llada_prefix_b4", "llada_dual_b4", "dream_prefix_entropy_b4",
                                  "dream_dual_entropy_b8"])
def test_fastdllm_cached_forwards(fixtures_dir, name):
    case = next(c for c in FAST_CASES if c["name"] == name)
    m = sinklens.load(fixtures_dir / case["family"])

    def run(hook):
        torch.manual_seed(case["seed"])
        return m.generate(torch.tensor(case["input_ids"]), hook=hook, **fast_kwargs(case))
    check(m, run)
