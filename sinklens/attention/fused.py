"""sdpa's own fused kernel, asked for the per-query log-sum-exp it computes anyway.

The lse route of the capture path takes the attention output from here and the column sums
from one extra pass, exp(q_i . k_j * scale - lse_i). The output is *bit-identical* to
transformers' `sdpa_attention_forward` on the same inputs, because it is the same kernel fed
the same tensors: this function repeats that function's choices (GQA packing / repeating, the
`is_causal` rule, the causal key crop, bool masks as -inf additive masks) and calls the aten
op that `torch.nn.functional.scaled_dot_product_attention` dispatches to: on CUDA the one torch's own
choice names for these inputs (flash, cuDNN or memory-efficient; where it names the math kernel,
which has no lse, F.sdpa runs itself and the caller finds the softmax another way).
tests/test_attention_routes.py checks the bit-identity on CPU; benchmarks/gpu_check.py on a GPU.
"""
from __future__ import annotations

import torch
from torch.nn.attention import SDPBackend
from transformers.integrations.sdpa_attention import repeat_kv


def lse_kernel_available(query: torch.Tensor) -> bool:
    """True where this module knows the fused kernel that returns a log-sum-exp."""
    return query.device.type in ("cpu", "cuda") and query.dtype in (torch.float32, torch.bfloat16, torch.float16)


def _kernel(query, key, value, mask, is_causal: bool, scaling: float):
    """(out (B, H, S_q, D), lse (B, H, >= S_q) float32) from the CPU kernel F.sdpa would pick."""
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        query, key, value, 0.0, is_causal, attn_mask=mask, scale=scaling
    )


def _cuda_kernel(query, key, value, mask, is_causal: bool, scaling: float, gqa: bool):
    """(out (B, H, S_q, D), lse (B, H, >= S_q) float32) from the kernel F.sdpa picks for these very
    inputs (flash, cuDNN or memory-efficient attention, by torch's own choice), or None where that
    choice has no log-sum-exp (the math kernel) or inputs F.sdpa would first reshape (a head size
    not a multiple of 8). Asking torch's choice keeps the output plain mode's bits on every GPU."""
    if query.shape[-1] % 8:
        return None
    choice = getattr(torch, "_fused_sdp_choice", None)   # (private; where a torch lacks it: its usual order)
    if choice is not None:
        backend = SDPBackend(choice(query, key, value, mask, 0.0, is_causal, scale=scaling, enable_gqa=gqa))
    elif mask is None and query.dtype in (torch.float16, torch.bfloat16) and query.shape[-1] <= 256:
        backend = SDPBackend.FLASH_ATTENTION
    else:
        backend = SDPBackend.EFFICIENT_ATTENTION if not gqa else SDPBackend.MATH
    if backend == SDPBackend.FLASH_ATTENTION:
        out = torch.ops.aten._scaled_dot_product_flash_attention(query, key, value, 0.0, is_causal, False, scale=scaling)
    elif backend == SDPBackend.CUDNN_ATTENTION:
        out = torch.ops.aten._scaled_dot_product_cudnn_attention(query, key, value, mask, True, 0.0, is_causal, False,
                                                                  scale=scaling)
    elif backend == SDPBackend.EFFICIENT_ATTENTION:
        if mask is not None:  # what F.sdpa does before this kernel: a bias per (batch, head), rows 16-aligned
            mask = _aligned(mask).expand(query.shape[0], query.shape[1], query.shape[2], key.shape[2])
        out = torch.ops.aten._scaled_dot_product_efficient_attention(query, key, value, mask, True, 0.0, is_causal,
                                                                      scale=scaling)
    else:
        return None
    lse = out[1]
    return out[0], (lse[..., 0] if lse.dim() == 4 else lse)  # cuDNN keeps a trailing axis of 1


def _aligned(mask: torch.Tensor, alignment: int = 16) -> torch.Tensor:
    """The mask with its rows' stride a multiple of `alignment` (the memory-efficient kernel reads it
    so; F.sdpa pads the last axis and slices it back, which leaves every value as it was)."""
    if all(st % alignment == 0 for st in mask.stride()[:-1]):
        return mask
    s_k = mask.shape[-1]
    return torch.nn.functional.pad(mask, (0, alignment - s_k % alignment))[..., :s_k]


def fused_sdpa_with_lse(
    query: torch.Tensor,  # (B, H, S_q, D)
    key: torch.Tensor,  # (B, H_kv, S_k, D)
    value: torch.Tensor,  # (B, H_kv, S_k, D)
    attention_mask: torch.Tensor | None,  # (B|1, 1|H, S_q, S_k) bool or additive float, or None
    scaling: float,
    is_causal: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(output (B, S_q, H, D) as sdpa_attention_forward returns it, lse (B, H, S_q) float32, or None
    where the kernel F.sdpa picks computes none: CUDA's math kernel)."""
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
    cuda = query.device.type == "cuda"
    # transformers hands F.sdpa the unrepeated keys with enable_gqa where it can (a CUDA call, no mask)
    gqa = cuda and rep > 1 and attention_mask is None and d <= 256
    packed = rep > 1 and s_q == 1 and attention_mask is not None
    if gqa:
        q, k, v = query, key, value
    elif packed:  # transformers' pack_gqa: one query per head becomes rep queries per kv head (a per-head mask too)
        q, k, v = query.reshape(b, h // rep, rep, d), key, value
        if attention_mask.shape[1] != 1:
            attention_mask = attention_mask.reshape(attention_mask.shape[0], h // rep, rep, attention_mask.shape[-1])
    else:
        # F.sdpa's enable_gqa (no mask) repeats the keys inside; with a mask transformers does it
        q, k, v = query, repeat_kv(key, rep), repeat_kv(value, rep)
    if not cuda:
        out, lse = _kernel(q, k, v, attention_mask, is_causal, scaling)
    else:
        fused = _cuda_kernel(q, k, v, attention_mask, is_causal, scaling, gqa)
        if fused is None:  # F.sdpa itself, as transformers calls it; the caller finds the softmax another way
            out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=attention_mask, is_causal=is_causal,
                                                                   scale=scaling, enable_gqa=gqa)
            return out.reshape(out.shape[0], h, s_q, d).transpose(1, 2).contiguous(), None
        out, lse = fused
    out = out.reshape(out.shape[0], h, s_q, d).transpose(1, 2).contiguous()
    lse = lse[..., :rep].reshape(b, h, 1) if packed else lse[..., :s_q]
    return out, lse.float()
