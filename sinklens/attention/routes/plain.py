"""The "plain" route: the model's own attention, untouched (no capture; blocked keys as a mask).

transformers' sdpa function, so logits are bit-identical to `attn_implementation="sdpa"`; for
layers sdpa cannot express (softcapping, learned sink logits) the model's own eager function, as
transformers runs them. Mask-only calls (keys blocked, nothing recorded) give it the blocked keys
as a float additive mask.
"""
from __future__ import annotations

import sys

import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from sinklens.attention.masks import additive, allowed_keys, apply_blocking
from sinklens.attention.routes.base import Call, Modifiers, Records, Route


def own_eager(module: torch.nn.Module):
    """The eager attention function of the module's own modeling file: what transformers runs for
    models sdpa cannot express (softcapping, sink logits)."""
    eager = getattr(sys.modules.get(type(module).__module__), "eager_attention_forward", None)
    if eager is None:
        raise ValueError(f"{type(module).__name__} needs softcapping or sink logits, which sdpa lacks, and its module "
                         "has no eager_attention_forward to run them")
    return eager


def plain(module, query, key, value, attention_mask, is_causal: bool, mods: Modifiers, **kwargs):
    """The model's own attention, untouched: transformers' sdpa, or for models sdpa cannot express
    their modeling file's eager function fed the additive mask transformers' eager mask would be."""
    if mods.sdpa_can:
        return sdpa_attention_forward(module, query, key, value, attention_mask, is_causal=is_causal, **kwargs)
    allowed = allowed_keys(attention_mask, is_causal, query.shape[2], key.shape[2], query.device)
    if allowed is not None:
        attention_mask = additive(allowed, query.dtype)
    out, _ = own_eager(module)(module, query, key, value, attention_mask, **kwargs)
    return out, None


def blocked_mask(call: Call, with_allowed: bool = True) -> tuple[torch.Tensor | None, bool, torch.Tensor | None]:
    """(mask for sdpa, is_causal, allowed after blocking): the blocked keys as a float additive mask
    (eager: `plain` remakes its own from it), or the call's own mask where nothing is blocked.
    with_allowed=False: `allowed` may be None where only the mask was to be made for it (the plain route)."""
    if call.blocked is None:
        return call.attention_mask, call.is_causal, call.allowed
    b, h, s_q, _ = call.query.shape
    s_k = call.key.shape[2]
    if call.allowed is None and not call.req.keep_self:  # every query sees every key: one mask row per head
        bias, _ = call.req.row_bias_for(call.module.layer_idx, call.query.dtype, s_k)  # (B, H, 1, S_k)
        return bias, False, (bias == 0).expand(b, h, s_q, s_k) if with_allowed else None
    allowed = apply_blocking(call.allowed, call.blocked, call.req.keep_self, s_q, s_k)
    return additive(allowed, call.query.dtype, sdpa=True), False, allowed


class Plain(Route):
    """Records nothing: chosen only where the request needs no probabilities."""

    name = "plain"
    records = Records(blocking=True, keep_self=True, masks=True, learned_sinks=True, softcap=True)

    def run(self, call: Call) -> torch.Tensor:
        mask, is_causal, _ = blocked_mask(call, with_allowed=False)
        out, _ = plain(call.module, call.query, call.key, call.value, mask, is_causal, call.mods,
                       scaling=call.scaling, **call.kwargs)
        return out
