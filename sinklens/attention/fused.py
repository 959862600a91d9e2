"""sdpa's own fused kernel, asked for the per-query log-sum-exp it computes anyway.

The lse route of the capture path takes the attention output from here and the column sums
from one extra pass, exp(q_i . k_j * scale - lse_i). The output is *bit-identical* to
transformers' `sdpa_attention_forward` on the same inputs, because it is the same kernel fed
the same tensors: this function repeats that function's choices (GQA packing / repeating, the
`is_causal` rule, the causal key crop, bool masks as -inf additive masks) and calls the aten
op that `torch.nn.functional.scaled_dot_product_attention` dispatches to. tests/test_attention_routes.py
checks the bit-identity on CPU; on CUDA it is not verified here (no GPU was available).
"""
from __future__ import annotations

import torch
from transformers.integrations.sdpa_attention import repeat_kv


def lse_kernel_available(query: torch.Tensor) -> bool:
    """True where this module knows the fused kernel that returns a log-sum-exp."""
    return query.device.type in ("cpu", "cuda") and query.dtype in (torch.float32, torch.bfloat16, torch.float16)


def _kernel(query, key, value, mask, is_causal: bool, scaling: float):
    """(out (B, H, S_q, D), lse (B, H, >= S_q) float32) from the kernel F.sdpa would pick."""
    if query.device.type == "cpu":
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            query, key, value, 0.0, is_causal, attn_mask=mask, scale=scaling
        )
    # CUDA: F.sdpa prefers flash (half precision, no mask), then memory-efficient attention.
    if mask is None and query.dtype in (torch.float16, torch.bfloat16) and query.shape[-1] <= 256:
        out = torch.ops.aten._scaled_dot_product_flash_attention(query, key, value, 0.0, is_causal, False, scale=scaling)
        return out[0], out[1]
    out = torch.ops.aten._scaled_dot_product_efficient_attention(
        query, key, value, mask, True, 0.0, is_causal, scale=scaling
    )
    return out[0], out[1]  # lse is padded to a multiple of 32 queries


def fused_sdpa_with_lse(
    query: torch.Tensor,  # (B, H, S_q, D)
    key: torch.Tensor,  # (B, H_kv, S_k, D)
    value: torch.Tensor,  # (B, H_kv, S_k, D)
    attention_mask: torch.Tensor | None,  # (B|1, 1|H, S_q, S_k) bool or additive float, or None
    scaling: float,
    is_causal: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(output (B, S_q, H, D) as sdpa_attention_forward returns it, lse (B, H, S_q) float32)."""
    b, h, s_q, d = query.shape
    rep = h // key.shape[1]
    is_causal = s_q > 1 and attention_mask is None and is_causal
    if is_causal and key.shape[2] > s_q:  # transformers crops an empty static cache's keys
        key, value = key[:, :, :s_q], value[:, :, :s_q]
    if attention_mask is not None and attention_mask.dtype == torch.bool:
        # what F.sdpa does with a bool mask before calling the kernel
        attention_mask = torch.zeros(attention_mask.shape, dtype=query.dtype, device=query.device).masked_fill_(
            ~attention_mask, float("-inf")
        )
    packed = rep > 1 and s_q == 1 and attention_mask is not None
    if packed:  # transformers' pack_gqa: one query per head becomes rep queries per kv head (a per-head mask too)
        q, k, v = query.reshape(b, h // rep, rep, d), key, value
        if attention_mask.shape[1] != 1:
            attention_mask = attention_mask.reshape(attention_mask.shape[0], h // rep, rep, attention_mask.shape[-1])
    else:
        # F.sdpa's enable_gqa (no mask) repeats the keys inside; with a mask transformers does it
        q, k, v = query, repeat_kv(key, rep), repeat_kv(value, rep)
    out, lse = _kernel(q, k, v, attention_mask, is_causal, scaling)
    out = out.reshape(out.shape[0], h, s_q, d).transpose(1, 2).contiguous()
    lse = lse[..., :rep].reshape(b, h, 1) if packed else lse[..., :s_q]
    return out, lse.float()
