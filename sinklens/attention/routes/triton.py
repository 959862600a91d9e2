"""The "triton" route: the fused kernel of triton_kernel.py, output and column sums in one launch.

It applies to calls without a padding mask (causal or bidirectional), without full maps, without
blocked keys, without softcapping or learned sinks, and without
the diagonal / distance readouts; elsewhere the registry routes the call on. Needs the extra
`gpu` (triton) and a CUDA device, or TRITON_INTERPRET=1 (CPU, for tests: slow). Never picked by
"auto": its speed is not measured (no GPU was available).
"""
from __future__ import annotations

import importlib.util
import os

import torch

from sinklens.attention.routes.base import Call, Records, Route


class Triton(Route):
    name = "triton"
    fallback = "lse"  # its kind: the output is a fused kernel's, never recomputed from a softmax
    # float32 only: in bfloat16 its column sums disagree with the exact route under the interpreter
    # (tests/test_attention_registry.py); on a GPU that is unmeasured, so bfloat16 calls go to lse
    records = Records(groups=True, dtypes=frozenset({torch.float32}))  # (its kernel blocks keys, but refuses a row left empty: blocking takes lse)

    def available(self, call: Call) -> bool:
        on_device = call.query.device.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1"
        return on_device and importlib.util.find_spec("triton") is not None

    def run(self, call: Call) -> torch.Tensor | None:
        from sinklens.attention.triton_kernel import fused_attention_colsums

        req = call.req
        causal = call.is_causal and call.query.shape[2] > 1
        out, _, received, groups = fused_attention_colsums(
            call.query, call.key, call.value, call.scaling, causal,
            query_weight=req.query_mask, query_groups=req.query_groups, num_groups=req.num_groups,
            received=req.capture)
        req.record(call.module.layer_idx, received=received, groups=groups)
        return out
