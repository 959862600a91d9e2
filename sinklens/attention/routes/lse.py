"""The "lse" route: the output from sdpa's fused kernel, the column sums from its log-sum-exp.

Output and per-query log-sum-exp from sdpa's own kernel (fused.py), so the output is
bit-identical to plain mode and observing a generation cannot change it; then the chunk loop
(exact.py) in one pass exp(s - lse) for the column sums. The default where the output must stay
sdpa's: CUDA, and half precision on the CPU (there the exact softmax's output drifts from sdpa's by
whole rounding steps, enough to change a generation). Layers sdpa cannot express (softcapping,
learned sinks) take their output from the model's own eager function and their softmax per chunk.
"""
from __future__ import annotations

import torch

from sinklens.attention.fused import fused_sdpa_with_lse, lse_kernel_available
from sinklens.attention.masks import empty_rows
from sinklens.attention.routes.base import Call, Records, Route
from sinklens.attention.routes.exact import capture
from sinklens.attention.routes.plain import blocked_mask, plain


class Lse(Route):
    name = "lse"
    records = Records(groups=True, blocking=True, keep_self=True, masks=True, maps=True, learned_sinks=True,
                      softcap=True, readouts=frozenset({"diagonal", "distance"}))
    auto = frozenset({("cuda", torch.float32), ("cuda", torch.bfloat16), ("cuda", torch.float16),
                      ("cpu", torch.bfloat16), ("cpu", torch.float16)})

    def available(self, call: Call) -> bool:
        return lse_kernel_available(call.query)

    def run(self, call: Call) -> torch.Tensor:
        mask, is_causal, allowed = blocked_mask(call)
        query, key, value = call.query, call.key, call.value
        if call.mods.sdpa_can:
            out, lse = fused_sdpa_with_lse(query, key, value, mask, call.scaling, is_causal)
        else:  # the model's own output (eager); its softmax, with the modifiers, is redone per chunk
            (out, _), lse = plain(call.module, query, key, value, mask, is_causal, call.mods,
                                  scaling=call.scaling, **call.kwargs), None
        # a query that may see no key has no finite lse: such chunks take the softmax instead
        capture(call.module, query, key, value, allowed, call.allowed, call.scaling, call.req, None,
                None if empty_rows(allowed) is not None else lse, call.mods, call.blocking)
        return out
