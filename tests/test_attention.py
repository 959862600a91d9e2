"""The sinklens attention function against transformers' own eager and sdpa attention.

Reference: transformers' eager attention with `output_attentions=True` (its maps, column-summed
over real query rows) and its sdpa attention (logits). Tiny random Llama and Qwen2 models,
causal and bidirectional, GQA, left and right padding.
"""
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from sinklens.attention import ATTENTION_NAME, AttentionRequest

B, S, V = 2, 12, 97


def tiny_model(kind: str, causal: bool, kv_heads: int = 2):
    common = dict(vocab_size=V, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
                  num_attention_heads=4, num_key_value_heads=kv_heads, max_position_embeddings=256)
    torch.manual_seed(0)
    if kind == "llama":
        model = LlamaForCausalLM(LlamaConfig(**common))
    else:
        model = Qwen2ForCausalLM(Qwen2Config(**common))  # q/k/v biases
    model.config.is_causal = causal
    return model.eval()


def run(model, impl: str, ids, am, **kw):
    model.config._attn_implementation = impl
    return model(ids, attention_mask=am, **kw)


def padding(kind: str) -> torch.Tensor:
    am = torch.ones(B, S, dtype=torch.long)
    if kind == "left":
        am[0, :4] = 0
    elif kind == "right":
        am[1, -5:] = 0
    return am


CASES = [(k, c, p, g) for k in ("llama", "qwen2") for c in (True, False) for p in ("none", "left", "right") for g in (1, 2, 4)]


@pytest.mark.parametrize("kind,causal,pad,kv", CASES)
def test_capture_equals_eager_column_sums_and_plain_equals_sdpa(kind, causal, pad, kv):
    model = tiny_model(kind, causal, kv)
    ids = torch.randint(0, V, (B, S), generator=torch.Generator().manual_seed(1))
    am = padding(pad)
    real = am.bool()

    eager = run(model, "eager", ids, am, output_attentions=True)
    ref_sdpa = run(model, "sdpa", ids, am).logits
    plain = run(model, ATTENTION_NAME, ids, am).logits
    assert torch.equal(plain, ref_sdpa)  # plain mode *is* sdpa

    req = AttentionRequest(capture=True, query_mask=real, query_chunk=5)  # chunks of 5: 3 chunks
    logits = run(model, ATTENTION_NAME, ids, am, sinklens=req).logits
    assert (logits - ref_sdpa)[real].abs().max() < 1e-5

    expected = torch.stack([(a * real[:, None, :, None]).sum(2) for a in eager.attentions])  # (L, B, H, S)
    got = req.received
    assert got.shape == (3, B, 4, S) and got.dtype == torch.float32
    assert (got - expected).abs().max() < 1e-5
    # padded keys receive nothing; real keys' totals equal the number of real queries
    pad_keys = (~real)[None, :, None, :].expand_as(got)
    assert (got[pad_keys] == 0).all()
    totals = got.sum(-1)  # (L, B, H): every real query row spends exactly 1
    torch.testing.assert_close(totals, real.sum(-1).float()[None, :, None].expand_as(totals))


def test_maps_and_query_groups_match_eager():
    model = tiny_model("qwen2", causal=False)
    ids = torch.randint(0, V, (B, S), generator=torch.Generator().manual_seed(2))
    am = padding("left")
    eager = run(model, "eager", ids, am, output_attentions=True).attentions
    groups = torch.randint(-1, 2, (B, S), generator=torch.Generator().manual_seed(3))
    req = AttentionRequest(capture=True, query_mask=am.bool(), query_groups=groups, num_groups=2,
                           map_slices=((1, 2), (2, 0)), query_chunk=4)
    run(model, ATTENTION_NAME, ids, am, sinklens=req)
    for (layer, head), m in req.maps.items():
        assert (m - eager[layer][:, head]).abs().max() < 1e-6
    real = am.bool()
    for g in range(2):
        sel = (groups == g) & real  # (B, S)
        expected = torch.stack([(a * sel[:, None, :, None]).sum(2) for a in eager])
        assert (req.received_groups[:, :, g] - expected).abs().max() < 1e-5


@pytest.mark.parametrize("causal", [True, False])
def test_blocking_one_key_in_one_head(causal):
    model = tiny_model("llama", causal)
    ids = torch.randint(0, V, (B, S), generator=torch.Generator().manual_seed(4))
    am = torch.ones(B, S, dtype=torch.long)
    base = AttentionRequest(capture=True)
    run(model, ATTENTION_NAME, ids, am, sinklens=base)

    layer, head, j = 1, 2, 3
    blocked = torch.zeros(3, B, 4, S, dtype=torch.bool)
    blocked[layer, :, head, j] = True
    req = AttentionRequest(capture=True, blocked=blocked, map_slices=((layer, head),))
    run(model, ATTENTION_NAME, ids, am, sinklens=req)

    got = req.received[layer]
    # the blocked key gets nothing in that head, except from a query with no other key
    # (causal query 0 can only see key 0; j = 3 > 0 so here it is exactly 0)
    assert got[:, head, j].abs().max() == 0
    others = [hh for hh in range(4) if hh != head]
    torch.testing.assert_close(got[:, others], base.received[layer][:, others])  # other heads unchanged
    torch.testing.assert_close(req.received[0], base.received[0])  # earlier layer unchanged
    rows = req.maps[(layer, head)].sum(-1)
    torch.testing.assert_close(rows, torch.ones_like(rows))  # every row still sums to 1

    # mask-only mode (sdpa with an additive mask) gives the same logits as capture + mask
    logits_masked = run(model, ATTENTION_NAME, ids, am, sinklens=AttentionRequest(blocked=blocked)).logits
    logits_capture = run(model, ATTENTION_NAME, ids, am, sinklens=AttentionRequest(capture=True, blocked=blocked)).logits
    assert (logits_masked - logits_capture).abs().max() < 1e-5


def test_never_blocks_a_queries_only_key_and_keep_self():
    model = tiny_model("llama", causal=True)
    ids = torch.randint(0, V, (1, S), generator=torch.Generator().manual_seed(5))
    blocked = torch.zeros(3, 1, 4, S, dtype=torch.bool)
    blocked[:, :, :, 0] = True  # position 0 blocked everywhere
    req = AttentionRequest(capture=True, blocked=blocked, map_slices=((0, 0),))
    logits = run(model, ATTENTION_NAME, ids, None, sinklens=req).logits
    assert torch.isfinite(logits).all()
    m = req.maps[(0, 0)]
    assert m[0, 0, 0] == 1.0  # query 0 has no other key: its row stays unblocked
    assert m[0, 1:, 0].abs().max() == 0  # everyone else lost key 0

    keep = AttentionRequest(capture=True, blocked=blocked, keep_self=True, map_slices=((0, 0),))
    run(model, ATTENTION_NAME, ids, None, sinklens=keep)
    blocked2 = torch.zeros(3, 1, 4, S, dtype=torch.bool)
    blocked2[:, :, :, 5] = True
    keep = AttentionRequest(capture=True, blocked=blocked2, keep_self=True, map_slices=((0, 0),))
    run(model, ATTENTION_NAME, ids, None, sinklens=keep)
    m = keep.maps[(0, 0)][0]
    assert m[5, 5] > 0 and m[6:, 5].abs().max() == 0


def test_kv_cache_decoding_step_captures_the_newest_row():
    """ARM decoding: query length 1 against a cache; compare with eager on the full sequence."""
    model = tiny_model("llama", causal=True)
    ids = torch.randint(0, V, (B, S), generator=torch.Generator().manual_seed(6))
    full = run(model, "eager", ids, None, output_attentions=True).attentions
    model.config._attn_implementation = ATTENTION_NAME
    out = model(ids[:, :-1], use_cache=True)
    req = AttentionRequest(capture=True)
    model(ids[:, -1:], past_key_values=out.past_key_values, use_cache=True, sinklens=req)
    expected = torch.stack([a[:, :, -1, :] for a in full])  # newest query's row (L, B, H, S)
    assert (req.received - expected).abs().max() < 1e-5


def test_bad_requests():
    with pytest.raises(ValueError, match="query_chunk"):
        AttentionRequest(query_chunk=0)
    with pytest.raises(ValueError, match="num_groups"):
        AttentionRequest(query_groups=torch.zeros(1, 3, dtype=torch.long))
    model = tiny_model("llama", causal=False)
    ids = torch.randint(0, V, (1, S))
    with pytest.raises(ValueError, match="expected"):
        run(model, ATTENTION_NAME, ids, None, sinklens=AttentionRequest(blocked=torch.zeros(3, 1, 4, S + 1, dtype=torch.bool)))
    with pytest.raises(RuntimeError, match="nothing captured"):
        AttentionRequest().received


def test_a_request_reused_with_edited_query_rows_sums_the_new_rows():
    """The query rows' weights are made once per forward for all layers; a request whose masks are
    edited in place (or replaced) between forwards must sum the rows it holds now, as eager does."""
    model = tiny_model("llama", causal=False)
    ids = torch.randint(0, V, (B, S), generator=torch.Generator().manual_seed(4))
    am = torch.ones(B, S, dtype=torch.long)
    eager = run(model, "eager", ids, am, output_attentions=True).attentions
    rows = torch.ones(B, S, dtype=torch.bool)
    groups = torch.zeros(B, S, dtype=torch.long)
    req = AttentionRequest(capture=True, query_mask=rows, query_groups=groups, num_groups=2)
    run(model, ATTENTION_NAME, ids, am, sinklens=req)
    rows[:, :5] = False          # in place: the same tensor, other rows
    groups[:, 7:] = 1
    run(model, ATTENTION_NAME, ids, am, sinklens=req)
    expected = torch.stack([(a * rows[:, None, :, None]).sum(2) for a in eager])
    assert (req.received - expected).abs().max() < 1e-5
    late = rows & (groups == 1)
    expected = torch.stack([(a * late[:, None, :, None]).sum(2) for a in eager])
    assert (req.received_groups[:, :, 1] - expected).abs().max() < 1e-5
    req.query_mask = torch.ones(B, S, dtype=torch.bool)   # replaced by a new tensor
    run(model, ATTENTION_NAME, ids, am, sinklens=req)
    assert (req.received - torch.stack([a.sum(2) for a in eager])).abs().max() < 1e-5
