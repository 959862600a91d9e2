"""Capture under block-causal attention (SDAR, LLaDA2: a query sees its own block and every earlier
one, blocks counted from position 0) against transformers' own eager attention.

Reference: transformers' eager attention of a tiny random Qwen3 (SDAR's architecture) given the
same block-causal mask as a float additive mask, `output_attentions=True`, column-summed. The
capture path's chunks skip the keys no query of the chunk can see (`chunk_view`); chunks that do
not line up with blocks must still keep every key some query of theirs sees, and later blocks
must receive exactly 0."""
from __future__ import annotations

import pytest
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from sinklens.attention import ATTENTION_NAME, AttentionRequest
from sinklens.attention.masks import chunk_view

S, V = 20, 97

torch.set_num_threads(1)


def block_causal(s: int, block: int) -> torch.Tensor:
    """(1, 1, S, S) bool: query i sees key j iff j // block <= i // block."""
    b = torch.arange(s) // block
    return (b[None, :] <= b[:, None])[None, None]


@pytest.fixture(scope="module")
def model():
    cfg = Qwen3Config(vocab_size=V, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=16, max_position_embeddings=256)
    cfg.is_causal = False  # every mask is given (as SDAR's loader does)
    torch.manual_seed(0)
    return Qwen3ForCausalLM(cfg).eval()


@pytest.mark.parametrize("block,chunk", [(4, 3), (4, 8), (5, 7), (8, None)])
def test_capture_equals_eager_column_sums(model, block, chunk):
    ids = torch.randint(0, V, (1, S), generator=torch.Generator().manual_seed(block))
    allowed = block_causal(S, block)
    pos = torch.arange(S)[None]
    model.config._attn_implementation = "eager"
    additive = torch.zeros(allowed.shape).masked_fill(~allowed, torch.finfo(torch.float32).min)
    eager = model(ids, attention_mask=additive, position_ids=pos, output_attentions=True)
    expected = torch.stack([a.sum(dim=2) for a in eager.attentions])            # (L, 1, H, S) column sums

    model.config._attn_implementation = ATTENTION_NAME
    plain = model(ids, attention_mask=allowed, position_ids=pos).logits
    req = AttentionRequest(capture=True, query_chunk=chunk, map_slices=((1, 3),))
    logits = model(ids, attention_mask=allowed, position_ids=pos, sinklens=req).logits
    assert (req.received - expected).abs().max() < 1e-5
    assert (logits - plain).abs().max() < 1e-5 and (plain - eager.logits).abs().max() < 1e-4
    full = req.maps[(1, 3)][0]                                                  # (S, S) one head's probabilities
    assert float(full[~allowed[0, 0]].abs().max()) == 0.0                       # a later block: exactly 0
    assert torch.allclose(full.sum(-1), torch.ones(S), atol=1e-5)               # every row a whole softmax
    assert torch.allclose(req.received.sum(-1), torch.full(req.received.shape[:-1], float(S)), atol=1e-4)


@pytest.mark.parametrize("block", [4, 32])
def test_chunks_skip_the_blocks_no_query_sees(block):
    """Each chunk of queries multiplies only the keys up to the end of its last query's block: the
    future blocks are skipped, as a causal chunk's future is."""
    s = 4 * block + 3
    allowed = block_causal(s, block)
    for start in range(0, s, 7):
        end = min(start + 7, s)
        ok, k0, k1, empty = chunk_view(allowed, start, end, s)
        assert (k0, k1) == (0, min(s, ((end - 1) // block + 1) * block))
        assert ok is None or tuple(ok.shape[-2:]) == (end - start, k1)
        assert empty is None  # every query sees its own block
