"""The "triton" route: sdpa's output and log-sum-exp, then the column sums from one Triton kernel.

The output and each query's log-sum-exp come from sdpa's own fused kernel (fused.py; on a GPU the
one F.sdpa itself picks), so the output has plain mode's bits; triton_kernel.py then sums
exp(q k^T * scale - lse) over the query rows per key, on chip, in one pass. With blocked keys the
output is sdpa's under the blocking mask (as the plain route's), and a second sdpa call gives the
unblocked log-sum-exp, from which the same pass sums what each key would have received. A mask
the call brings (padding, blocks, windows) is read by the kernel tile by tile. It takes no calls
for full maps, softcapping, learned sinks or in-pass readouts, nor a per-head mask or a causal
call over a cache without one; the registry sends those to lse. Needs the extra `gpu` (triton) and
a CUDA device, or TRITON_INTERPRET=1 (CPU, for tests: slow).
"""
from __future__ import annotations

import importlib.util
import os

import torch

from sinklens.attention.fused import fused_sdpa_with_lse
from sinklens.attention.masks import additive, apply_blocking
from sinklens.attention.routes.base import Call, Records, Route
from sinklens.attention.routes.exact import capture

CUDA = frozenset({("cuda", torch.float32), ("cuda", torch.bfloat16), ("cuda", torch.float16)})


class Triton(Route):
    name = "triton"
    fallback = "lse"  # the same output (sdpa's), column sums by torch chunks: takes every call this one declines
    records = Records(groups=True, blocking=True, keep_self=True, masks=True)
    auto = CUDA

    def available(self, call: Call) -> bool:
        on_device = call.query.device.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1"
        return on_device and importlib.util.find_spec("triton") is not None

    def run(self, call: Call) -> torch.Tensor | None:
        from sinklens.attention.triton_kernel import column_sums

        query, key, value, req = call.query, call.key, call.value, call.req
        s_q, s_k = query.shape[2], key.shape[2]
        mask = call.attention_mask
        causal = call.is_causal and s_q > 1 and mask is None
        if causal and s_q != s_k:
            return None  # a causal call over a cache without a mask: lse's (sdpa aligns causal top-left)
        if call.allowed is not None and call.allowed.shape[1] != 1:
            return None  # a per-head mask: lse's
        lse_free, first_free, allowed = None, None, call.allowed
        if call.blocked is None:
            out, lse = fused_sdpa_with_lse(query, key, value, mask, call.scaling, causal)
        else:
            if call.allowed is None and not req.keep_self:  # every query sees every key: one mask row per head
                bias, first_free = req.row_bias_for(call.module.layer_idx, query.dtype, s_k)  # as plain.blocked_mask
            else:
                allowed = apply_blocking(call.allowed, call.blocked, req.keep_self, s_q, s_k)
                # the plain route's mask values; without a mask of the call's no row is empty (apply_blocking
                # gives a row it would empty its keys back), so the empty-row test (a GPU sync) is skipped
                bias = additive(allowed, query.dtype, sdpa=mask is not None)
            out, lse = fused_sdpa_with_lse(query, key, value, bias, call.scaling, False)
            _, lse_free = fused_sdpa_with_lse(query, key, value, mask, call.scaling, causal)
        if lse is None or (call.blocked is not None and lse_free is None):
            # F.sdpa's kernel here keeps no lse (CUDA's math kernel): the chunked softmax records
            if call.blocked is not None and allowed is call.allowed:
                allowed = apply_blocking(call.allowed, call.blocked, req.keep_self, s_q, s_k)
            capture(call.module, query, key, value, allowed, call.allowed, call.scaling, req, None, None,
                    call.mods, call.blocking)
            return out
        received, groups, unblocked = column_sums(
            query, key, lse, call.scaling, causal, query_weight=req.query_mask, query_groups=req.query_groups,
            num_groups=req.num_groups, received=req.capture, blocked=call.blocked, lse_free=lse_free,
            keep_self=req.keep_self, first_free=first_free, allowed=None if mask is None else call.allowed,
            allowed_blocked=allowed if mask is not None and call.blocked is not None else None)
        req.record(call.module.layer_idx, received=received, unblocked=unblocked, groups=groups)
        return out
