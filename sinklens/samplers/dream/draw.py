"""Dream's token draw (`sample_tokens` with its top-p / top-k filters and confidences), shared by
its sampler (sample.py) and the Fast-dLLM cached decoding (fast.py)."""
from __future__ import annotations

import torch
import torch.nn.functional as F


def top_p_filter(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest set of tokens whose probability mass reaches top_p (the token that
    crosses the threshold stays); the rest get finfo.min."""
    sorted_logits, order = torch.sort(logits, descending=True)
    cum = torch.cumsum(F.softmax(sorted_logits, dim=-1), dim=-1)
    drop_sorted = cum > top_p
    drop_sorted[..., 1:] = drop_sorted[..., :-1].clone()  # shift right: keep the crossing token
    drop_sorted[..., 0] = False
    drop = torch.zeros_like(logits, dtype=torch.bool).scatter_(-1, order, drop_sorted)
    return logits.masked_fill(drop, torch.finfo(logits.dtype).min)


def top_k_filter(logits: torch.Tensor, top_k: int) -> torch.Tensor:
    """Keep the top_k largest logits (ties with the k-th kept); the rest get finfo.min."""
    k = min(top_k, logits.shape[-1])
    kth = torch.topk(logits, k)[0][..., -1, None]
    return logits.masked_fill(logits < kth, torch.finfo(logits.dtype).min)


def sample_tokens(logits: torch.Tensor, temperature: float = 0.0, top_p: float | None = None,
                  top_k: int | None = None, confidence: str = "prob") -> tuple[torch.Tensor, torch.Tensor]:
    """(N, V) logits -> (confidence (N,), token (N,)). confidence in {prob, margin, neg_entropy}."""
    if temperature > 0:
        logits = logits / temperature
    if top_p is not None and top_p < 1:
        logits = top_p_filter(logits, top_p)
    if top_k is not None:
        logits = top_k_filter(logits, top_k)
    probs = torch.softmax(logits, dim=-1)  # (N, V)
    if temperature > 0:
        try:
            x0 = torch.distributions.Categorical(probs=probs).sample()
            conf = torch.gather(probs, -1, x0[:, None]).squeeze(-1)
        except (ValueError, RuntimeError):  # invalid probabilities: the official code falls back to argmax
            conf, x0 = probs.max(dim=-1)
    else:
        conf, x0 = probs.max(dim=-1)
    if confidence == "margin":
        top2 = torch.sort(probs, dim=-1, descending=True)[0]
        conf = top2[:, 0] - top2[:, 1]
    elif confidence == "neg_entropy":
        conf = torch.sum(probs * torch.log(probs + 1e-10), dim=-1)
    return conf, x0


CONFIDENCE = {"maskgit_plus": "prob", "topk_margin": "margin", "entropy": "neg_entropy"}
