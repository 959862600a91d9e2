"""The "triton" route: sdpa's output and log-sum-exp, then the column sums from one Triton kernel.

The output and each query's log-sum-exp come from sdpa's own fused kernel (fused.py; flash
attention on a GPU), so the output has plain mode's bits; triton_kernel.py then sums
exp(q k^T * scale - lse) over the query rows per key, on chip, in one pass. It takes calls
without a mask beyond causal (no padding, no block or window mask), without blocked keys, full
maps, softcapping, learned sinks or in-pass readouts; the registry sends the others to lse. Needs
the extra `gpu` (triton) and a CUDA device, or TRITON_INTERPRET=1 (CPU, for tests: slow).
"""
from __future__ import annotations

import importlib.util
import os

import torch

from sinklens.attention.fused import fused_sdpa_with_lse
from sinklens.attention.routes.base import Call, Records, Route
from sinklens.attention.routes.exact import capture

CUDA = frozenset({("cuda", torch.float32), ("cuda", torch.bfloat16), ("cuda", torch.float16)})


class Triton(Route):
    name = "triton"
    fallback = "lse"  # the same output (sdpa's), column sums by torch chunks: takes every call this one declines
    records = Records(groups=True)
    auto = CUDA

    def available(self, call: Call) -> bool:
        on_device = call.query.device.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1"
        return on_device and importlib.util.find_spec("triton") is not None

    def run(self, call: Call) -> torch.Tensor | None:
        from sinklens.attention.triton_kernel import column_sums

        query, key, req = call.query, call.key, call.req
        s_q, s_k = query.shape[2], key.shape[2]
        causal = call.is_causal and s_q > 1
        if call.attention_mask is not None or (causal and s_q != s_k):
            return None  # a mask, or a causal call over a cache: lse's (sdpa aligns causal top-left)
        out, lse = fused_sdpa_with_lse(query, key, call.value, None, call.scaling, causal)
        if lse is None:  # F.sdpa's kernel here keeps no lse (CUDA's math kernel): the chunked softmax records
            capture(call.module, query, key, call.value, call.allowed, call.allowed, call.scaling, req, None, None,
                    call.mods, False)
            return out
        received, groups = column_sums(query, key, lse, call.scaling, causal, query_weight=req.query_mask,
                                       query_groups=req.query_groups, num_groups=req.num_groups,
                                       received=req.capture)
        req.record(call.module.layer_idx, received=received, groups=groups)
        return out
