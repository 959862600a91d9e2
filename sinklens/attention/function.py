"""The one attention function of sinklens: plain, capture and mask modes.

Registered under the name "sinklens" in transformers' `AttentionInterface` (and its mask
function under the same name in `AttentionMaskInterface`, or transformers would hand us no
padding mask at all). Every model sinklens loads runs through it; per-call instructions
arrive as `kwargs["sinklens"]`, an `AttentionRequest`.

- plain (no request, or a request that neither captures nor blocks): transformers' own sdpa
  function, so logits are bit-identical to `attn_implementation="sdpa"`.
- mask only: sdpa with the blocked keys folded into a float additive mask.
- capture (and maps / query groups): queries in chunks; scores and softmax in float32; the
  chunk's probabilities are reduced to column sums at once, so at most one layer's
  (B, H, chunk, S_k) probabilities are alive.
- capture with blocked keys: the same pass also reduces the softmax over the keys allowed
  *before* blocking (`AttentionRequest.received_unblocked`): one exp, two normalisers. Sink
  masking ranks next step's sinks on it; ranking on what the blocked model did would see a
  blocked sink at ~0 and set it free every other step.
"""
from __future__ import annotations

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from sinklens.attention.request import AttentionRequest
from sinklens.attention.weights import with_weights

ATTENTION_NAME = "sinklens"


def _allowed_keys(
    attention_mask: torch.Tensor | None, is_causal: bool, s_q: int, s_k: int, device
) -> torch.Tensor | None:
    """(B or 1, 1, S_q, S_k) bool: which keys each query may see before any blocking.

    None means "every key" (bidirectional without padding, or a single decoding query).
    """
    if attention_mask is None:
        if not is_causal or s_q == 1:
            return None
        # Lower-right alignment: with a KV cache the queries are the last S_q positions.
        q_pos = torch.arange(s_k - s_q, s_k, device=device)
        return (q_pos[:, None] >= torch.arange(s_k, device=device)[None, :])[None, None]
    if attention_mask.dtype == torch.bool:
        return attention_mask
    # A float additive mask: 0 = attend, a large negative number = do not.
    return attention_mask > torch.finfo(attention_mask.dtype).min / 2


def _apply_blocking(
    allowed: torch.Tensor | None, blocked: torch.Tensor, keep_self: bool, s_q: int, s_k: int
) -> torch.Tensor:
    """(B, H, S_q, S_k) bool allowed keys after blocking `blocked` (B, H, S_k).

    A query row left with nothing to attend to keeps its unblocked row: blocking must never
    turn a softmax into 0/0 (e.g. query 0 of a causal model sees only key 0).
    """
    if allowed is None:
        allowed = torch.ones(1, 1, s_q, s_k, dtype=torch.bool, device=blocked.device)
    block = blocked[:, :, None, :].expand(-1, -1, s_q, -1)  # (B, H, S_q, S_k)
    if keep_self:
        q_pos = torch.arange(s_k - s_q, s_k, device=blocked.device)
        is_self = q_pos[:, None] == torch.arange(s_k, device=blocked.device)[None, :]  # (S_q, S_k)
        block = block & ~is_self
    after = allowed & ~block
    empty_row = ~after.any(dim=-1, keepdim=True)  # (B, H, S_q, 1)
    return torch.where(empty_row, allowed.expand_as(after), after)


def _captured_attention(
    module: torch.nn.Module,
    query: torch.Tensor,  # (B, H, S_q, D), after RoPE
    key: torch.Tensor,  # (B, H_kv, S_k, D), before the GQA repeat
    value: torch.Tensor,  # (B, H_kv, S_k, D)
    allowed: torch.Tensor | None,  # (B or 1, 1 or H, S_q, S_k) bool; None = every key
    scaling: float,
    req: AttentionRequest,
    allowed_unblocked: torch.Tensor | None = None,  # allowed keys before blocking; set when keys are blocked
    unblocked: bool = False,  # also reduce the softmax over `allowed_unblocked` (the ranking source)
) -> torch.Tensor:
    b, h, s_q, d = query.shape
    h_kv, s_k = key.shape[1], key.shape[2]
    rep = h // h_kv  # query head i uses kv head i // rep, as transformers' repeat_kv
    layer = module.layer_idx

    # Group query heads by their kv head instead of repeating keys: (B, H_kv, rep, S_q, D).
    q = query.reshape(b, h_kv, rep, s_q, d)
    k_t = key.float().unsqueeze(2).transpose(-1, -2)  # (B, H_kv, 1, D, S_k)
    v = value.unsqueeze(2)  # (B, H_kv, 1, S_k, D)

    qmask = req.query_mask
    qmask = torch.ones(b, s_q, dtype=torch.bool, device=query.device) if qmask is None else qmask.bool()
    qmask = qmask.to(query.device)
    if req.query_groups is not None:
        groups = torch.nn.functional.one_hot(
            (req.query_groups.to(query.device) + 1).clamp(min=0), req.num_groups + 1
        )[..., 1:].float()  # (B, S_q, G); id -1 -> all zeros
        groups = groups * qmask[..., None]
        received_groups = torch.zeros(b, req.num_groups, h, s_k, dtype=torch.float32, device=query.device)
    wanted_maps = [hd for (ly, hd) in req.map_slices if ly == layer]
    maps = {hd: torch.empty(b, s_q, s_k, dtype=torch.float32, device=query.device) for hd in wanted_maps}

    received = torch.zeros(b, h, s_k, dtype=torch.float32, device=query.device)
    received_unblocked = torch.zeros_like(received) if unblocked else None
    out = torch.empty(b, h_kv, rep, s_q, d, dtype=query.dtype, device=query.device)
    neg = torch.finfo(torch.float32).min

    def chunk_of(mask, start, end):  # (B|1, 1|H, S_q, S_k) -> broadcastable to (B, H_kv, rep, c, S_k)
        ok = mask[:, :, start:end]
        if ok.shape[1] == 1:
            return ok.reshape(ok.shape[0], 1, 1, end - start, s_k)
        return ok.reshape(ok.shape[0], h_kv, rep, end - start, s_k)

    for start in range(0, s_q, req.query_chunk):
        end = min(start + req.query_chunk, s_q)
        scores = torch.matmul(q[:, :, :, start:end].float(), k_t).mul_(scaling)  # (B, H_kv, rep, c, S_k)
        qm = qmask[:, start:end].float()  # (B, c)
        if unblocked:
            # One exp over the keys allowed *before* blocking, two normalisers: the unblocked
            # softmax (what the keys would have received) and, after zeroing the blocked keys,
            # the softmax the model actually uses. No extra matmul, no second (c, S_k) buffer.
            if allowed_unblocked is not None:
                scores.masked_fill_(~chunk_of(allowed_unblocked, start, end), neg)
            scores.sub_(scores.amax(dim=-1, keepdim=True)).exp_()
            z = scores.sum(dim=-1)  # (B, H_kv, rep, c)
            w = (qm[:, None, None, :] / z).reshape(b, h, end - start)  # per-row weight 1/Z, 0 on non-query rows
            received_unblocked += torch.einsum("bhqk,bhq->bhk", scores.reshape(b, h, end - start, s_k), w)
            scores.masked_fill_(~chunk_of(allowed, start, end), 0.0)
            z = scores.sum(dim=-1, keepdim=True)
            if bool((z < 1e-30).any()):
                # A blocked key held (almost) all the mass: the others underflowed relative to its
                # score. Rare; redo this chunk's softmax over the allowed keys alone, exactly.
                scores = torch.matmul(q[:, :, :, start:end].float(), k_t).mul_(scaling)
                scores.masked_fill_(~chunk_of(allowed, start, end), neg)
                scores.sub_(scores.amax(dim=-1, keepdim=True)).exp_()
                z = scores.sum(dim=-1, keepdim=True)
            probs = scores.div_(z)  # (B, H_kv, rep, c, S_k) float32
        else:
            if allowed is not None:
                scores.masked_fill_(~chunk_of(allowed, start, end), neg)
            # softmax in place: this buffer is the largest thing alive, so no second copy of it
            scores.sub_(scores.amax(dim=-1, keepdim=True)).exp_()
            probs = scores.div_(scores.sum(dim=-1, keepdim=True))  # (B, H_kv, rep, c, S_k) float32
        out[:, :, :, start:end] = torch.matmul(probs.to(value.dtype), v)
        p = probs.reshape(b, h, end - start, s_k)  # (B, H, c, S_k)
        if req.query_mask is None:
            received += p.sum(dim=2)
        else:
            received += torch.einsum("bhqk,bq->bhk", p, qm)
        if req.query_groups is not None:
            received_groups += torch.einsum("bhqk,bqg->bghk", p, groups[:, start:end])
        for hd, m in maps.items():
            m[:, start:end] = p[:, hd]
        del scores, probs, p

    if req.capture:
        req._received[layer] = received
        if received_unblocked is not None:
            req._received_unblocked[layer] = received_unblocked
    if req.query_groups is not None:
        req._received_groups[layer] = received_groups
    for hd, m in maps.items():
        req.maps[(layer, hd)] = m
    return out.reshape(b, h, s_q, d).transpose(1, 2).contiguous()  # (B, S_q, H, D)


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
    blocked = req.blocked_for(module.layer_idx) if req is not None else None
    if req is None or (blocked is None and not req.needs_probabilities):
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    if dropout > 0.0:
        raise ValueError("sinklens capture/mask modes are for inference; got attention dropout > 0 (model in training mode?)")

    b, h, s_q, d = query.shape
    s_k = key.shape[2]
    scaling = d**-0.5 if scaling is None else scaling
    is_causal = kwargs.get("is_causal")
    is_causal = getattr(module, "is_causal", True) if is_causal is None else is_causal
    allowed = unblocked = _allowed_keys(attention_mask, is_causal, s_q, s_k, query.device)
    if blocked is not None:
        if blocked.shape != (b, h, s_k):
            raise ValueError(
                f"blocked for layer {module.layer_idx} has shape {tuple(blocked.shape)}, expected (B, H, S_k) = {(b, h, s_k)}"
            )
        allowed = _apply_blocking(allowed, blocked.to(query.device), req.keep_self, s_q, s_k)

    if req.needs_probabilities:
        out = _captured_attention(module, query, key, value, allowed, scaling, req, allowed_unblocked=unblocked,
                                  unblocked=blocked is not None and req.capture)
        return out, None

    # Mask only: sdpa with the blocked keys as a float additive mask (allowed is set: blocked is).
    bias = torch.zeros(allowed.shape, dtype=query.dtype, device=query.device)
    bias = bias.masked_fill(~allowed, torch.finfo(query.dtype).min)
    kwargs["is_causal"] = False  # causality is already in `allowed`
    return sdpa_attention_forward(module, query, key, value, bias, dropout=dropout, scaling=scaling, **kwargs)


def register() -> str:
    """Register the sinklens attention (and its mask function); idempotent. Returns the name."""
    AttentionInterface.register(ATTENTION_NAME, sinklens_attention)
    # sdpa_mask gives a bool mask (or None where sdpa's own is_causal suffices), which is what
    # both our sdpa fast path and our capture path expect.
    AttentionMaskInterface.register(ATTENTION_NAME, sdpa_mask)
    return ATTENTION_NAME
