"""The ARM sampler's logit filters, written to select exactly the tokens transformers' `generate`
keeps (its TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper, MinPLogitsWarper with
min_tokens_to_keep = 1, in that order). Dream's own filters (samplers/dream/draw.py) cut top-p
at a different boundary: a token whose preceding mass equals top_p exactly stays there, and
float rounding of the two cumulative sums differs, so a seeded draw could pick another token.
Removed tokens get -inf, as in transformers."""
from __future__ import annotations

import torch


def top_k_filter(logits: torch.Tensor, top_k: int) -> torch.Tensor:
    """(B, V): keep the top_k largest logits (ties with the k-th stay); top_k = 0 keeps all."""
    if not top_k:
        return logits
    kth = torch.topk(logits, min(top_k, logits.shape[-1]))[0][..., -1, None]  # (B, 1)
    return logits.masked_fill(logits < kth, -float("inf"))


def top_p_filter(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """(B, V): drop the least likely tokens while their summed probability stays <= 1 - top_p,
    summing from the least likely up (transformers' order); the most likely token always stays."""
    if top_p >= 1:
        return logits
    sorted_logits, order = torch.sort(logits, descending=False)  # (B, V) ascending
    cum = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
    drop_sorted = cum <= (1 - top_p)
    drop_sorted[..., -1:] = False
    drop = drop_sorted.scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, -float("inf"))


def min_p_filter(logits: torch.Tensor, min_p: float) -> torch.Tensor:
    """(B, V): drop tokens less likely than min_p x the most likely token's probability."""
    probs = torch.softmax(logits, dim=-1)  # (B, V)
    drop = probs < min_p * probs.amax(dim=-1, keepdim=True)
    drop.scatter_(-1, torch.topk(probs, 1, dim=-1).indices, False)  # the most likely token always stays
    return logits.masked_fill(drop, -float("inf"))


def warp(logits: torch.Tensor, temperature: float, top_k: int | None, top_p: float | None,
         min_p: float | None) -> torch.Tensor:
    """(B, V) float32 logits -> the filtered, tempered logits transformers samples from."""
    if temperature != 1.0:
        logits = logits / temperature
    if top_k:
        logits = top_k_filter(logits, top_k)
    if top_p is not None:
        logits = top_p_filter(logits, top_p)
    if min_p is not None:
        logits = min_p_filter(logits, min_p)
    return logits
