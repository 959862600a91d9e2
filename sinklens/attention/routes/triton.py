"""The "triton" route: sdpa's output and log-sum-exp, then the column sums from one Triton kernel.

The output and each query's log-sum-exp come from sdpa's own fused kernel (fused.py; on a GPU the
one F.sdpa itself picks), so the output has plain mode's bits; triton_kernel.py then sums
exp(q k^T * scale - lse) over the query rows per key, on chip, in one pass. With blocked keys the
output is sdpa's under the blocking mask (as the plain route's), and a second sdpa call gives the
unblocked log-sum-exp, from which the same pass sums what each key would have received. It takes
calls without a mask beyond causal (no padding, no block or window mask), full maps, softcapping,
learned sinks or in-pass readouts; the registry sends the others to lse. Needs the extra `gpu`
(triton) and a CUDA device, or TRITON_INTERPRET=1 (CPU, for tests: slow).
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
    records = Records(groups=True, blocking=True, keep_self=True)
    auto = CUDA

    def available(self, call: Call) -> bool:
        on_device = call.query.device.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1"
        return on_device and importlib.util.find_spec("triton") is not None

    def run(self, call: Call) -> torch.Tensor | None:
        from sinklens.attention.triton_kernel import column_sums

        query, key, value, req = call.query, call.key, call.value, call.req
        s_q, s_k = query.shape[2], key.shape[2]
        causal = call.is_causal and s_q > 1
        if call.attention_mask is not None or (causal and s_q != s_k):
            return None  # a mask, or a causal call over a cache: lse's (sdpa aligns causal top-left)
        lse_free = None
        if call.blocked is None:
            allowed = call.allowed
            out, lse = fused_sdpa_with_lse(query, key, value, None, call.scaling, causal)
        else:
            # no padding here, and apply_blocking gives a row it would empty its keys back: no row is
            # empty, so the mask is the plain route's values without its empty-row test (a GPU sync)
            allowed = apply_blocking(call.allowed, call.blocked, req.keep_self, s_q, s_k)
            out, lse = fused_sdpa_with_lse(query, key, value, additive(allowed, query.dtype), call.scaling, False)
            _, lse_free = fused_sdpa_with_lse(query, key, value, None, call.scaling, causal)
        if lse is None or (call.blocked is not None and lse_free is None):
            # F.sdpa's kernel here keeps no lse (CUDA's math kernel): the chunked softmax records
            capture(call.module, query, key, value, allowed, call.allowed, call.scaling, req, None, None,
                    call.mods, call.blocking)
            return out
        received, groups, unblocked = column_sums(
            query, key, lse, call.scaling, causal, query_weight=req.query_mask, query_groups=req.query_groups,
            num_groups=req.num_groups, received=req.capture, blocked=call.blocked, lse_free=lse_free,
            keep_self=req.keep_self)
        req.record(call.module.layer_idx, received=received, unblocked=unblocked, groups=groups)
        return out
