"""The "exact" route over a whole small layer at once (`SMALL_SCORES`): the shipped twins, short prompts.

The same probabilities as the chunk loop (exact.py) in a handful of torch calls instead of the
loop's ~20, whose dispatch cost, not arithmetic, is what tracing such a model costs. It declines
(the chunk loop runs) where the loop must decide: a row whose visible keys are all blocked, a
blocked key that held (almost) all of a row's mass.
"""
from __future__ import annotations

import torch

from sinklens.attention.masks import empty_rows
from sinklens.attention.reduce import row_matrix
from sinklens.attention.request import AttentionRequest
from sinklens.attention.routes.base import Call, Modifiers, Records, Route
from sinklens.attention.routes.exact import empty_rows_as_plain, one_in_empty_rows

# A layer with at most this many scores (B·H·S_q·S_k, 512 kB in float32) is captured whole, not in
# chunks: 0.6× the loop's time at 6 × 34, 0.8× at 8 × 128 (benchmarks/bench_small_layer.py).
SMALL_SCORES = 2**17


def capture_whole(
    module: torch.nn.Module,
    query: torch.Tensor,  # (B, H, S_q, D), after RoPE
    key: torch.Tensor,  # (B, H_kv, S_k, D), before the GQA repeat
    value: torch.Tensor,  # (B, H_kv, S_k, D)
    allowed: torch.Tensor | None,  # (B|1, 1, S_q, S_k) bool keys each query may see (before blocking); None = every key
    blocked: torch.Tensor | None,  # (B, H, S_k) bool keys blocked in this layer; None: none blocked
    scaling: float,
    req: AttentionRequest,
    mods: Modifiers,
) -> torch.Tensor | None:
    """The exact route over the whole layer at once: (B, S_q, H, D) output, captures on `req`.

    The same probabilities as the chunk loop (a float32 softmax over the allowed keys; blocked keys
    zeroed and each row renormalised over the rest, as there — or, for one decoding row, a second
    softmax over the keys left) in fused calls: one matmul, one softmax, one batched matmul for every
    summed row set (all rows, each query group) and one for the output. A query that may see no key has probabilities 0 and the plain route's output (as the
    chunk loop). None (nothing recorded) where the chunk loop must decide: a row whose visible keys
    are all blocked, or a blocked key that held (almost) all of a row's mass."""
    b, h, s_q, d = query.shape
    h_kv, s_k = key.shape[1], key.shape[2]
    rep = h // h_kv  # query head i uses kv head i // rep, as transformers' repeat_kv
    empty = empty_rows(allowed)  # (B|1, 1, S_q, 1) rows that may see no key, or None
    # Query heads grouped by their kv head as rows of one matrix, (B·H_kv, rep·S_q, D) (a view: head
    # i = kv head i // rep), so every product is one batched matmul and no key or value is repeated.
    # (Conversions only where needed: on a tiny model each call is a sizeable share of the layer.)
    q = _as_float32(query).reshape(b * h_kv, rep * s_q, d)
    k = _as_float32(key).reshape(b * h_kv, s_k, d)
    scores = torch.bmm(q, k.transpose(1, 2)).mul_(scaling).view(b, h, s_q, s_k)   # (B, H, S_q, S_k)
    if mods.softcap is not None:  # Gemma2: logits squashed into (-cap, cap), before the mask (as eager)
        scores = scores.div_(mods.softcap).tanh_().mul_(mods.softcap)
    if allowed is not None:
        scores.masked_fill_(~allowed, float("-inf"))
    probs = torch.softmax(scores, dim=-1)  # (B, H, S_q, S_k) float32
    if empty is not None:
        probs.masked_fill_(empty, 0.0)  # a row of -inf came out NaN: no key seen, no probabilities
    rows = row_matrix(req, query.device)  # (B, 1, 1 + G, S_q) the summed rows' weights, then each group's
    unblocked = None
    if blocked is not None:
        # what the keys would have received (the masking's ranking source), then the softmax the model uses
        unblocked = _column_sums(probs, rows) if req.capture else None
        if s_q == 1 and allowed is None and req.most_blocked(module.layer_idx) < s_k:
            # one decoding row that sees every key and keeps one: a second softmax over the keys left
            # (exact; over a whole (S_q, S_k) layer the renormalisation below costs less: 6 x 34 x 34,
            # 4 layers, 212 vs 225 µs; one row of 25 keys, 99 vs 114 µs)
            probs = torch.softmax(scores.masked_fill_(blocked.unsqueeze(2), float("-inf")), dim=-1)
        else:
            # blocked keys zeroed, each row renormalised over what is left (as the chunk loop)
            probs = probs * req.kept_for(module.layer_idx, s_k).to(query.device)  # kept (B, H, 1, S_k): 1.0 where not blocked
            z = one_in_empty_rows(probs.sum(dim=-1, keepdim=True), empty)  # (B, H, S_q, 1)
            if float(z.min()) < 1e-30:
                return None
            probs = probs.div_(z)
    p = probs.view(b * h_kv, rep * s_q, s_k)
    out = torch.bmm(p if p.dtype == value.dtype else p.to(value.dtype), value.reshape(b * h_kv, s_k, d))  # (B·H_kv, rep·S_q, D)
    received = groups = None
    if rows is None or req.query_groups is None:
        received = _column_sums(probs, rows) if req.capture else None
    else:
        sums = torch.matmul(rows, probs)  # (B, H, 1 + G, S_k): every row set in one batched matmul
        received = sums[:, :, 0] if req.capture else None
        groups = sums[:, :, 1:].transpose(1, 2)  # (B, G, H, S_k)
    req.record(module.layer_idx, received=received, unblocked=unblocked, groups=groups)
    out = out.view(b, h, s_q, d)
    if empty is not None:
        empty_rows_as_plain(out, allowed, value, mods)
    out = out.transpose(1, 2)  # (B, S_q, H, D)
    return out if s_q == 1 else out.contiguous()  # one query row: already contiguous


def _as_float32(x: torch.Tensor) -> torch.Tensor:
    return x if x.dtype == torch.float32 else x.float()


def _column_sums(p: torch.Tensor, rows: torch.Tensor | None) -> torch.Tensor:
    """(B, H, S_k) sums of p (B, H, S_q, S_k) over the summed rows (`row_matrix`'s row 0; None: all rows)."""
    if rows is None:
        return p[:, :, 0] if p.shape[2] == 1 else p.sum(dim=2)   # one query row (ARM decoding): the row itself
    return torch.matmul(rows[:, :, :1], p)[:, :, 0]




class ExactWhole(Route):
    name = "exact-whole"
    records = Records(groups=True, blocking=True, masks=True, softcap=True)
    auto = frozenset({("cpu", torch.float32)})  # elsewhere the lse route keeps the output sdpa's

    def run(self, call: Call) -> torch.Tensor | None:
        query, key = call.query, call.key
        b, h, s_q, _ = query.shape
        if call.req.query_chunk is not None or b * h * s_q * key.shape[2] > SMALL_SCORES:
            return None
        return capture_whole(call.module, query, key, call.value, call.allowed, call.blocked, call.scaling,
                             call.req, call.mods)
