"""The "exact" route, chunked: queries in chunks, a float32 softmax per chunk, the output from it.

Queries in chunks of at most CHUNK_BYTES of float32 scores, each chunk's probabilities reduced to
the column sums at once (reduce.py), so at most one chunk of one layer's probabilities is alive.
Keys no query of a chunk can see (a causal chunk's future, left padding) are skipped, and masked
scores are never exponentiated (see reduce.py for why that matters on CPU). It records everything
a request can ask, full maps included, on every device and dtype: the reference the other routes
are tested against.

With blocked keys the same pass also reduces the softmax over the keys allowed *before* blocking
(`AttentionRequest.received_unblocked`): one exp, two normalisers. Sink masking ranks next step's
sinks on it; ranking on what the blocked model did would see a blocked sink at ~0 and set it free
every other step.

The lse route (lse.py) runs the same loop without the output: its probabilities come from
exp(s - lse) with the log-sum-exp of sdpa's fused kernel.
"""
from __future__ import annotations

import torch

from sinklens.attention.masks import apply_blocking, chunk_view, empty_rows
from sinklens.attention.reduce import LayerSums, probs_from_lse_, softmax_with_sink_
from sinklens.attention.request import AttentionRequest
from sinklens.attention.routes.base import Call, Modifiers, Records, Route

CHUNK_BYTES = 8 * 2**20  # one chunk's float32 scores: 8 MB stays in cache (measured: docs/benchmarks.md)
# On a GPU memory is plentiful and kernel launches are not: 8 MB at S = 16k and 32 heads would be 4
# query rows per chunk. 512 MB (256 rows there) is a choice, not yet a measurement (no GPU so far).
CHUNK_BYTES_CUDA = 512 * 2**20
MASKED_CHUNK = 128  # at most, where a mask lets chunks skip keys (causal: measured best of 64 / 128 / 256)


def _per_kv_head(ok: torch.Tensor | None, h_kv: int, rep: int) -> torch.Tensor | None:
    """(B|1, 1|H, c, K) -> broadcastable to the scores' (B, H_kv, rep, c, K)."""
    if ok is None or ok.shape[1] == 1:
        return None if ok is None else ok.unsqueeze(2)
    return ok.reshape(ok.shape[0], h_kv, rep, *ok.shape[2:])


def capture(
    module: torch.nn.Module,
    query: torch.Tensor,  # (B, H, S_q, D), after RoPE
    key: torch.Tensor,  # (B, H_kv, S_k, D), before the GQA repeat
    value: torch.Tensor,  # (B, H_kv, S_k, D)
    allowed: torch.Tensor | None,  # (B|1, 1|H, S_q, S_k) bool; None = every key
    allowed_unblocked: torch.Tensor | None,  # allowed keys before blocking (when keys are blocked)
    scaling: float,
    req: AttentionRequest,
    out: torch.Tensor | None,  # (B, H_kv, rep, S_q, D) to fill (exact route), or None (lse route)
    lse: torch.Tensor | None,  # (B, H, S_q) float32 from the fused kernel (lse route), or None
    mods: Modifiers,
    blocking: bool,  # keys are blocked in this layer: `allowed` is after blocking, the unblocked sums are recorded
) -> None:
    """The chunk loop: fills `out` if given and records the layer's captures on `req`."""
    b, h, s_q, d = query.shape
    h_kv, s_k = key.shape[1], key.shape[2]
    rep = h // h_kv  # query head i uses kv head i // rep, as transformers' repeat_kv

    # Group query heads by their kv head instead of repeating keys: (B, H_kv, rep, S_q, D).
    q = query.reshape(b, h_kv, rep, s_q, d)
    k_t = key.float().unsqueeze(2).transpose(-1, -2)  # (B, H_kv, 1, D, S_k)
    v = value.unsqueeze(2)  # (B, H_kv, 1, S_k, D)
    lse = None if lse is None else lse.reshape(b, h_kv, rep, s_q)
    # a learned sink: one logit per query head, a key every query sees (B, H_kv, rep, 1, 1)
    sink = None if mods.sinks is None else mods.sinks.float().reshape(1, h_kv, rep, 1, 1)
    unblocked = blocking
    sums = LayerSums.for_request(req, module.layer_idx, b, h, s_q, s_k, unblocked, query.device, sink is not None)
    budget = CHUNK_BYTES_CUDA if query.is_cuda else CHUNK_BYTES
    chunk = req.query_chunk or max(16, budget // (4 * b * h * s_k))
    if req.query_chunk is None and allowed_unblocked is not None:
        chunk = min(chunk, MASKED_CHUNK)  # finer chunks skip more of a causal future

    def scores_of(start: int, end: int, k0: int, k1: int) -> torch.Tensor:
        """(B, H_kv, rep, c, K) float32 logits of queries [start, end) against keys [k0, k1)."""
        scores = torch.matmul(q[:, :, :, start:end].float(), k_t[..., k0:k1]).mul_(scaling)
        if mods.softcap is not None:  # Gemma2: logits squashed into (-cap, cap), before the mask (as eager)
            scores = scores.div_(mods.softcap).tanh_().mul_(mods.softcap)
        return scores

    for start in range(0, s_q, chunk):
        end = min(start + chunk, s_q)
        # keys [k0, k1): the only ones some query of this chunk can see
        ok, k0, k1, empty = chunk_view(allowed_unblocked if unblocked else allowed, start, end, s_k)
        ok, empty = _per_kv_head(ok, h_kv, rep), _per_kv_head(empty, h_kv, rep)  # empty: rows that see no key
        scores = scores_of(start, end, k0, k1)  # (B, H_kv, rep, c, K)
        shape = (b, h, end - start, k1 - k0)
        sink_num = None  # the learned sink's softmax numerator (B, H_kv, rep, c, 1), where there is one
        if unblocked:
            # One exp over the keys allowed *before* blocking, two normalisers: the unblocked
            # softmax (what the keys would have received) and, after zeroing the blocked keys,
            # the softmax the model actually uses. No extra matmul, no second (c, K) buffer.
            scores, sink_num = softmax_with_sink_(scores, ok, sink)
            sink_num = _no_sink_in_empty_rows(sink_num, empty)
            z = one_in_empty_rows(scores.sum(dim=-1, keepdim=True) + (0.0 if sink_num is None else sink_num), empty)
            sums.add_unblocked(scores.reshape(shape), 1.0 / z.reshape(shape[:3]), start, end, k0, k1)
            ok_blocked = _per_kv_head(allowed[:, :, start:end, k0:k1], h_kv, rep)
            z = one_in_empty_rows(scores.masked_fill_(~ok_blocked, 0.0).sum(dim=-1, keepdim=True), empty)
            if bool((z < 1e-30).any()):
                # A blocked key held (almost) all the mass: the others underflowed relative to its
                # score. Rare; redo this chunk's softmax over the allowed keys alone, exactly.
                scores, sink_num = softmax_with_sink_(scores_of(start, end, k0, k1), ok_blocked, sink)
                sink_num = _no_sink_in_empty_rows(sink_num, empty)
                z = one_in_empty_rows(scores.sum(dim=-1, keepdim=True), empty)
            z = z if sink_num is None else z + sink_num
            probs = scores.div_(z)
        elif lse is not None:
            probs = probs_from_lse_(scores, lse[..., start:end], ok)
        else:
            probs, sink_num = softmax_with_sink_(scores, ok, sink)
            sink_num = _no_sink_in_empty_rows(sink_num, empty)
            z = probs.sum(dim=-1, keepdim=True)
            z = one_in_empty_rows(z if sink_num is None else z + sink_num, empty)
            probs = probs.div_(z)  # (B, H_kv, rep, c, K) float32
        if out is not None:
            out[:, :, :, start:end] = torch.matmul(probs.to(value.dtype), v[..., k0:k1, :])
        sums.add(probs.reshape(shape), start, end, k0, k1)
        if sink_num is not None:
            sums.add_sink((sink_num / z).reshape(shape[:3]), start, end)
        del scores, probs
    sums.store(req, module.layer_idx)
    if out is not None:
        empty_rows_as_plain(out.view(b, h, s_q, d), allowed, value, mods)


def one_in_empty_rows(z: torch.Tensor, empty: torch.Tensor | None) -> torch.Tensor:
    """A softmax normaliser (..., c, 1) with 1 in the rows that may see no key: their numerators are all
    0, so their probabilities stay 0 (no 0/0). Every other row's normaliser is >= 1 (its max is exp(0))."""
    return z if empty is None else z.masked_fill(empty, 1.0)


def _no_sink_in_empty_rows(sink_num: torch.Tensor | None, empty: torch.Tensor | None) -> torch.Tensor | None:
    """A learned sink takes nothing from a row that may see no key: that row is not summed at all."""
    return sink_num if sink_num is None or empty is None else sink_num.masked_fill(empty, 0.0)


def empty_rows_as_plain(out: torch.Tensor, allowed: torch.Tensor | None, value: torch.Tensor, mods: Modifiers) -> None:
    """In place: out (B, H, S_q, D) of the rows that may see no key, as the plain route gives them. Their
    probabilities are 0, so out is 0 there: sdpa's output, and eager's under a learned sink (it takes
    the whole row). A softcapping model's eager adds finfo.min to every score of such a row: equal
    logits, uniform over every key."""
    if mods.softcap is None or mods.sinks is not None:
        return
    empty = empty_rows(allowed)
    if empty is None:
        return
    b, h, s_q, d = out.shape
    h_kv, s_k = value.shape[1], value.shape[2]
    uniform = torch.full((1, 1, 1, s_k), 1.0 / s_k, dtype=value.dtype, device=value.device)
    mean = torch.matmul(uniform, value).repeat_interleave(h // h_kv, dim=1)  # (B, H, 1, D): eager's row
    out.copy_(torch.where(empty, mean, out))




class Exact(Route):
    name = "exact"
    records = Records(groups=True, blocking=True, keep_self=True, masks=True, maps=True, learned_sinks=True,
                      softcap=True, readouts=frozenset({"diagonal", "distance"}))
    # the fallback everywhere: torch's own ops on any device
    auto = frozenset((dev, dt) for dev in ("cpu", "cuda") for dt in (torch.float32, torch.bfloat16, torch.float16))

    def run(self, call: Call) -> torch.Tensor:
        query, key, value = call.query, call.key, call.value
        b, h, s_q, d = query.shape
        allowed = call.allowed
        if call.blocked is not None:
            allowed = apply_blocking(allowed, call.blocked, call.req.keep_self, s_q, key.shape[2])
        h_kv = key.shape[1]
        out = torch.empty(b, h_kv, h // h_kv, s_q, d, dtype=query.dtype, device=query.device)
        capture(call.module, query, key, value, allowed, call.allowed, call.scaling, call.req, out, None, call.mods,
                call.blocking)
        return out.reshape(b, h, s_q, d).transpose(1, 2).contiguous()  # (B, S_q, H, D)
