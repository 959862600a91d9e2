"""Full attention maps for the standard routes: `output_attentions=True` and `run_with_cache`.

transformers' `output_attentions=True` collects the second value every attention function
returns; sdpa returns None, so on an sdpa-style function the tuple comes back empty. The
sinklens function instead answers such a call through its capture path (scores and softmax in
float32, the same path that records received attention), so the maps equal transformers' eager
attention and the received attention sinklens reports is their column sum.

    out = m.model(ids, output_attentions=True)     # out.attentions: L × (B, H, S_q, S_k)
    logits, cache = m.run_with_cache(ids, names_filter=lambda n: n.endswith("hook_pattern"))

Cache names follow TransformerLens: `blocks.{l}.attn.hook_pattern` (B, H, S_q, S_k), the
attention probabilities; sinklens adds `blocks.{l}.attn.hook_received` (B, H, S_k), the column
sums r_j = Σ_i A[i, j] over real query rows (docs/analysis.md).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch

from sinklens.attention.request import AttentionRequest

PATTERN = "blocks.{}.attn.hook_pattern"
RECEIVED = "blocks.{}.attn.hook_received"


def with_weights(attention_fn: Callable, module, query, key, value, attention_mask, **kwargs):
    """Run `attention_fn` so that it also returns the (B, H, S_q, S_k) maps of this layer.

    Called by the sinklens attention function when transformers passes `output_attentions=True`.
    The caller's own request (capture, blocking, map slices) is honoured: this layer's heads are
    added to its map slices for the call, and maps the caller did not ask for are taken out again.
    """
    kwargs.pop("output_attentions", None)     # handled here; sdpa would only warn about it
    layer, h = module.layer_idx, query.shape[1]
    wanted = tuple((layer, hd) for hd in range(h))
    req: AttentionRequest | None = kwargs.pop("sinklens", None)
    own = req if req is not None else AttentionRequest()
    asked = set(own.map_slices)
    # replace() keeps the caller's output dicts (same objects): captures land in the caller's request
    call = dataclasses.replace(own, map_slices=tuple(sorted(asked | set(wanted))))
    out, _ = attention_fn(module, query, key, value, attention_mask, sinklens=call, **kwargs)
    maps = [own.maps[s] if s in asked else own.maps.pop(s) for s in wanted]
    return out, torch.stack(maps, dim=1).to(query.dtype)   # (B, H, S_q, S_k), eager returns the model dtype


# ---- run_with_cache --------------------------------------------------------------------------

def cache_names(num_layers: int) -> list[str]:
    """Every name `run_with_cache` can fill, in layer order."""
    return [n.format(l) for l in range(num_layers) for n in (PATTERN, RECEIVED)]


def select_names(names_filter, num_layers: int) -> list[str]:
    """TransformerLens semantics: None = all, a string = that name, a list = those names, a
    callable = the names it returns True for. Unknown names are an error, not an empty cache."""
    names = cache_names(num_layers)
    if names_filter is None:
        return names
    if callable(names_filter):
        return [n for n in names if names_filter(n)]
    wanted = [names_filter] if isinstance(names_filter, str) else list(names_filter)
    unknown = [n for n in wanted if n not in names]
    if unknown:
        raise ValueError(f"names_filter: unknown name(s) {unknown[:3]}; expected names like "
                         f"{PATTERN.format(0)!r} or {RECEIVED.format(0)!r} for layers 0..{num_layers - 1}")
    return [n for n in names if n in wanted]


def run_with_cache(model, input_ids, attention_mask=None, names_filter=None) -> tuple[torch.Tensor, dict]:
    """(logits (B, S, V) float32, {name: tensor}) for a `SinkModel`; names as in the module docstring.

    Only what the filter asks for is computed: maps for the layers whose `hook_pattern` is wanted,
    received attention when any `hook_received` is.
    """
    names = select_names(names_filter, model.num_layers)
    pattern_layers = [l for l in range(model.num_layers) if PATTERN.format(l) in names]
    req = AttentionRequest(capture=any(n.endswith("hook_received") for n in names),
                           map_slices=tuple((l, h) for l in pattern_layers for h in range(model.num_heads)))
    logits = model.forward_logits(input_ids, attention_mask, attention=req)
    cache: dict[str, torch.Tensor] = {}
    received = req.received if req.capture else None                    # (L, B, H, S_k)
    for l in range(model.num_layers):
        if l in pattern_layers:
            cache[PATTERN.format(l)] = torch.stack([req.maps[(l, h)] for h in range(model.num_heads)], dim=1)
        if received is not None and RECEIVED.format(l) in names:
            cache[RECEIVED.format(l)] = received[l]
    return logits, cache

