"""The "triton" capture route: the fused kernel of triton_kernel.py where it applies.

It applies to calls without a padding mask (causal or bidirectional), without full maps, and
without the unblocked ranking source of sink masking; `capture` returns None elsewhere and the
attention function takes the lse route instead. Needs the extra `gpu` (triton) and a CUDA
device, or TRITON_INTERPRET=1 (CPU, for tests: slow).
"""
from __future__ import annotations

import importlib.util
import os

import torch


def available(query: torch.Tensor) -> bool:
    on_device = query.device.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1"
    return on_device and importlib.util.find_spec("triton") is not None


def capture(module, query, key, value, attention_mask, scaling: float, is_causal: bool, blocked, req):
    """(B, S_q, H, D) output with the layer's captures recorded on `req`, or None (not applicable)."""
    if attention_mask is not None or req.map_slices or (blocked is not None and req.capture) or not available(query):
        return None
    from sinklens.attention.triton_kernel import fused_attention_colsums

    causal = is_causal and query.shape[2] > 1
    out, _, received, groups = fused_attention_colsums(
        query, key, value, scaling, causal, blocked=blocked, keep_self=req.keep_self,
        query_weight=req.query_mask, query_groups=req.query_groups, num_groups=req.num_groups,
        received=req.capture)
    req.record(module.layer_idx, received=received, groups=groups)
    return out
