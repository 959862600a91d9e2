"""The one attention function of sinklens: checks, then dispatch to a capture route.

Registered under the name "sinklens" in transformers' `AttentionInterface` (and its mask
function under the same name in `AttentionMaskInterface`, or transformers would hand us no
padding mask at all). Every model sinklens loads runs through it; per-call instructions
arrive as `kwargs["sinklens"]`, an `AttentionRequest`.

What it does itself: refuse arguments it does not implement (one line, never a silent
difference), check a sliding window has its mask, record the readouts of q, k and v, and build
the layer's `Call`. What computes the attention is a route (sinklens/attention/routes/: plain,
compiled, exact, lse, triton), each declaring what it can record; `choose_route` lists those that
cover the call and the first that does not decline runs.

- plain (no request, or a request that neither captures nor blocks): transformers' own sdpa, so
  logits are bit-identical to `attn_implementation="sdpa"` (the model's eager function for layers
  sdpa cannot express); mask only: the same with the blocked keys as a float additive mask.
- capture: on a CPU in float32 the compiled one-pass kernel where it builds, else the exact route
  (whole small layers at once, larger ones in chunks); the lse route (output = sdpa's bits) on
  CUDA and in half precision; the measurements behind these choices: docs/benchmarks.md.
- modifiers (`Modifiers`): what a layer passes beyond q, k, v and its mask (scaling, softcap,
  s_aux sink logits; sliding windows arrive in the mask) is honoured by every route; any other
  argument with a value is refused in one line rather than dropped.
- capture with blocked keys: the same pass also reduces the softmax over the keys allowed
  *before* blocking (`AttentionRequest.received_unblocked`), the masking's ranking source. A layer
  where the request blocks no key runs as unmasked, and its received attention is its ranking source.
"""
from __future__ import annotations

import torch
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from sinklens.attention.readouts import record_vectors
from sinklens.attention.request import AttentionRequest
from sinklens.attention.routes import Call, Modifiers, choose_route
from sinklens.attention.routes.base import NO_MODIFIERS
from sinklens.attention.routes.plain import plain
from sinklens.attention.weights import with_weights

ATTENTION_NAME = "sinklens"


# Keyword arguments transformers' attention modules pass that this function implements, and those
# that say nothing about the attention itself (they ride along in every model's **kwargs). Any
# other one with a value is refused: computing the attention without it would silently differ.
IMPLEMENTED = ("scaling", "dropout", "is_causal", "sliding_window", "softcap", "s_aux", "output_attentions", "sinklens")
PASSIVE = ("position_ids", "cache_position", "use_cache", "output_router_logits", "output_hidden_states",
           "return_dict", "encoder_hidden_states", "token_type_ids",
           "deterministic")  # ModernBERT: a flash-attention reproducibility switch


KNOWN_KWARGS = frozenset(IMPLEMENTED + PASSIVE)


def modifiers(module: torch.nn.Module, kwargs: dict) -> Modifiers:
    """The layer's modifiers from the call's kwargs; one line naming any argument we do not implement."""
    if not KNOWN_KWARGS.issuperset(kwargs):   # (one C-level test of the names: every layer of every step)
        for name, val in kwargs.items():
            if name in KNOWN_KWARGS or val is None or val is False:
                continue
            shown = f"a {type(val).__name__}" if isinstance(val, torch.Tensor) else repr(val)
            raise ValueError(f"{type(module).__name__} (layer {getattr(module, 'layer_idx', '?')}) passes "
                             f"{name}={shown} to its attention function, which the sinklens attention does not "
                             "implement")
    softcap, sinks = kwargs.get("softcap"), kwargs.get("s_aux")
    # every layer of most models: one shared instance (a frozen dataclass costs a tiny model's layer ~1 µs)
    return NO_MODIFIERS if softcap is None and sinks is None else Modifiers(softcap=softcap, sinks=sinks)


def check_window(module: torch.nn.Module, window: int | None, attention_mask: torch.Tensor | None, s_k: int,
                 is_causal: bool) -> None:
    """A causal sliding layer's window lives in the mask transformers builds; with no mask every
    key is seen, which is right only while all keys fit in the window. (A bidirectional layer may
    hold its window in its cache instead: DiffusionGemma's decoder gets only the last keys.)"""
    if window is not None and is_causal and attention_mask is None and s_k > window:
        raise ValueError(f"layer {module.layer_idx} has a sliding window of {window} but got no mask over {s_k} keys: "
                         "its window would be ignored")


def sinklens_attention(
    module: torch.nn.Module,
    query: torch.Tensor,  # (B, H, S_q, D)
    key: torch.Tensor,  # (B, H_kv, S_k, D)
    value: torch.Tensor,  # (B, H_kv, S_k, D)
    attention_mask: torch.Tensor | None,  # (B, 1, S_q, S_k) bool, or None
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    if kwargs.get("output_attentions"):   # transformers' output_attentions=True: maps via the capture path
        return with_weights(sinklens_attention, module, query, key, value, attention_mask,
                            scaling=scaling, dropout=dropout, **kwargs)
    req: AttentionRequest | None = kwargs.pop("sinklens", None)
    mods = modifiers(module, kwargs)
    b, h, s_q, d = query.shape
    s_k = key.shape[2]
    is_causal = kwargs.pop("is_causal", None)
    is_causal = getattr(module, "is_causal", True) if is_causal is None else is_causal
    window = kwargs.get("sliding_window")
    if window is not None:
        check_window(module, window, attention_mask, s_k, is_causal)
    # None where this layer blocks no key: its attention runs as unmasked (its received is its ranking source)
    blocked = req.blocked_for(module.layer_idx, (b, h, s_k)) if req is not None else None
    if req is not None and (req.value_norms or req.qk_norms):   # readouts of q, k, v themselves: any route
        record_vectors(req, module.layer_idx, query, key, value, req.query_mask)
    if req is None or (blocked is None and not req.needs_probabilities):
        return plain(module, query, key, value, attention_mask, is_causal, mods, dropout=dropout, scaling=scaling, **kwargs)
    if dropout > 0.0:
        raise ValueError("sinklens capture/mask modes are for inference; got attention dropout > 0 (model in training mode?)")

    device = query.device
    if blocked is not None and blocked.device != device:   # (a model spread over devices; the test costs less than .to)
        blocked = blocked.to(device)
    call = Call(module=module, query=query, key=key, value=value, attention_mask=attention_mask, is_causal=is_causal,
                scaling=d**-0.5 if scaling is None else scaling, req=req, mods=mods, blocked=blocked, kwargs=kwargs)
    for route in choose_route(call):
        out = route.run(call)
        if out is not None:
            return out, None
    raise RuntimeError("no capture route took this call (the chunked exact route takes every call)")  # unreachable


def register() -> str:
    """Register the sinklens attention (and its mask function); idempotent. Returns the name."""
    AttentionInterface.register(ATTENTION_NAME, sinklens_attention)
    # sdpa_mask gives a bool mask (or None where sdpa's own is_causal suffices), which is what
    # both our sdpa fast path and our capture path expect.
    AttentionMaskInterface.register(ATTENTION_NAME, sdpa_mask)
    return ATTENTION_NAME
