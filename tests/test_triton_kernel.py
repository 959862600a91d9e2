"""The fused Triton kernel (extra `gpu`) on CPU through Triton's interpreter, against torch's own
sdpa (output) and a float64 softmax (column sums). Skipped when triton is not installed."""
import pytest
import torch

pytest.importorskip("triton")  # TRITON_INTERPRET=1 is set in conftest.py: kernels run on the CPU
from sinklens.attention.triton_kernel import fused_attention_colsums  # noqa: E402

B, H, H_KV, D = 1, 4, 2, 16


def reference(q, k, v, scale, allowed, weight, groups, num_groups):
    """float64 softmax over allowed keys; rows that see no key contribute nothing."""
    kk = k.double().repeat_interleave(H // H_KV, 1)
    s = torch.einsum("bhqd,bhkd->bhqk", q.double(), kk) * scale
    p = s.masked_fill(~allowed, float("-inf")).softmax(-1).nan_to_num(0.0)
    received = torch.einsum("bhqk,bq->bhk", p, weight.double())
    onehot = torch.nn.functional.one_hot(groups + 1, num_groups + 1)[..., 1:].double() * weight.double()[..., None]
    return received, torch.einsum("bhqk,bqg->bghk", p, onehot)


@pytest.mark.parametrize("causal,s_q,s_k,blocking", [(True, 24, 24, False), (True, 24, 24, True), (False, 24, 24, True),
                                                     (True, 5, 37, True), (False, 5, 37, False)])
def test_kernel_matches_sdpa_and_float64_column_sums(causal, s_q, s_k, blocking):
    g = torch.Generator().manual_seed(s_q + s_k)
    q = torch.randn(B, H, s_q, D, generator=g)
    k, v = torch.randn(B, H_KV, s_k, D, generator=g), torch.randn(B, H_KV, s_k, D, generator=g)
    key_ok = torch.ones(B, s_k, dtype=torch.bool)
    key_ok[0, :3] = False  # left padding
    blocked = None
    if blocking:
        blocked = torch.zeros(B, H, s_k, dtype=torch.bool)
        blocked[:, 1, 6] = True
        blocked[0, 3, -2] = True
    q_pos = torch.arange(s_k - s_q, s_k)
    allowed = key_ok[:, None, None, :].expand(B, H, s_q, s_k)
    if causal:
        allowed = allowed & (torch.arange(s_k)[None, :] <= q_pos[:, None])
    if blocked is not None:
        allowed = allowed & ~blocked[:, :, None, :]
    weight = torch.rand(B, s_q, generator=g).round()
    groups = torch.randint(-1, 2, (B, s_q), generator=g)
    out, lse, received, rg = fused_attention_colsums(q, k, v, 0.25, causal, key_ok=key_ok, blocked=blocked,
                                                     query_weight=weight, query_groups=groups, num_groups=2,
                                                     block_m=8, block_n=16)
    ref_r, ref_g = reference(q, k, v, 0.25, allowed, weight, groups, 2)
    assert (received - ref_r).abs().max() < 1e-5
    assert (rg - ref_g).abs().max() < 1e-5
    seen = allowed.any(-1)  # (B, H, S_q)
    ref_out = torch.nn.functional.scaled_dot_product_attention(
        q, k.repeat_interleave(H // H_KV, 1), v.repeat_interleave(H // H_KV, 1), attn_mask=allowed, scale=0.25)
    assert (out.transpose(1, 2) - ref_out)[seen].abs().max() < 1e-5


def test_blocking_that_empties_a_row_is_refused():
    q, k, v = torch.randn(1, H, 4, D), torch.randn(1, H_KV, 4, D), torch.randn(1, H_KV, 4, D)
    blocked = torch.zeros(1, H, 4, dtype=torch.bool)
    blocked[0, 0, 0] = True  # causal query 0 sees only key 0
    with pytest.raises(ValueError, match="no key to attend to"):
        fused_attention_colsums(q, k, v, 0.25, True, blocked=blocked)


def test_triton_route_in_a_model_equals_eager_column_sums():
    """Through the attention function (route="triton"): a tiny causal GQA Llama, no padding."""
    from sinklens.attention import ATTENTION_NAME, AttentionRequest
    from test_attention import B as B_, S, V, run, tiny_model
    model = tiny_model("llama", True, 2)
    ids = torch.randint(0, V, (B_, S), generator=torch.Generator().manual_seed(5))
    eager = run(model, "eager", ids, None, output_attentions=True)
    req = AttentionRequest(capture=True, route="triton")
    logits = run(model, ATTENTION_NAME, ids, None, sinklens=req).logits
    assert (logits - eager.logits).abs().max() < 1e-4
    assert (req.received - torch.stack([a.sum(2) for a in eager.attentions])).abs().max() < 1e-5
