"""The one attention function of sinklens: plain, capture and mask modes.

Registered under the name "sinklens" in transformers' `AttentionInterface` (and its mask
function under the same name in `AttentionMaskInterface`, or transformers would hand us no
padding mask at all). Every model sinklens loads runs through it; per-call instructions
arrive as `kwargs["sinklens"]`, an `AttentionRequest`.

- plain (no request, or a request that neither captures nor blocks): transformers' own sdpa
  function, so logits are bit-identical to `attn_implementation="sdpa"`; for layers sdpa cannot
  express (softcapping, learned sink logits) the model's own eager function, as transformers runs them.
- mask only: the same, with the blocked keys folded into a float additive mask.
- capture (and maps / query groups): queries in chunks, scores in float32, each chunk's
  probabilities reduced to column sums at once, so at most one chunk of one layer's
  probabilities is alive. Two routes to the same column sums (`AttentionRequest.route`):
  - exact: softmax per chunk, and the output from those same probabilities;
  - lse: output and per-query log-sum-exp from sdpa's fused kernel (so the output is
    bit-identical to plain mode and observing a generation cannot change it), then one pass
    exp(s - lse) for the column sums. Auto: lse on CUDA and in half precision, exact on a
    float32 CPU, where it measured faster (docs/benchmarks.md; in bfloat16 too, but there its
    output drifts from sdpa's by whole rounding steps and can change a generation).
  A third, "triton", is a fused kernel (triton_route.py; extra `gpu`), where it applies.
  A small layer (at most SMALL_SCORES scores: the shipped twins, short prompts) takes the exact
  route in one pass over the whole layer (`_capture_whole`): a handful of torch calls instead of
  the chunk loop's ~20, whose dispatch cost, not arithmetic, is what tracing such a model costs.
  In the chunk loop, keys no query of a chunk can see (a causal chunk's future, left padding) are skipped, and
  masked scores are never exponentiated (see reduce.py for why that matters on CPU).
- modifiers (`Modifiers`): what a layer passes beyond q, k, v and its mask (scaling, softcap,
  s_aux sink logits; sliding windows arrive in the mask) is honoured by every route; any other
  argument with a value is refused in one line rather than dropped.
- capture with blocked keys: the same pass also reduces the softmax over the keys allowed
  *before* blocking (`AttentionRequest.received_unblocked`): one exp, two normalisers. Sink
  masking ranks next step's sinks on it; ranking on what the blocked model did would see a
  blocked sink at ~0 and set it free every other step. A layer where the request blocks no key
  runs as unmasked, and its received attention is its ranking source.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from sinklens.attention import triton_route
from sinklens.attention.fused import fused_sdpa_with_lse, lse_kernel_available
from sinklens.attention.masks import additive, allowed_keys, apply_blocking, chunk_view, empty_rows
from sinklens.attention.readouts import record_vectors
from sinklens.attention.reduce import LayerSums, probs_from_lse_, row_matrix, softmax_with_sink_
from sinklens.attention.request import AttentionRequest
from sinklens.attention.weights import with_weights

ATTENTION_NAME = "sinklens"
CHUNK_BYTES = 8 * 2**20  # one chunk's float32 scores: 8 MB stays in cache (measured: docs/benchmarks.md)
MASKED_CHUNK = 128  # at most, where a mask lets chunks skip keys (causal: measured best of 64 / 128 / 256)
# A layer with at most this many scores (B·H·S_q·S_k, 512 kB in float32) is captured whole, not in
# chunks: 0.6× the loop's time at 6 × 34, 0.8× at 8 × 128 (benchmarks/bench_small_layer.py;
# docs/benchmarks.md, "Trace capture and masking").
SMALL_SCORES = 2**17


def _per_kv_head(ok: torch.Tensor | None, h_kv: int, rep: int) -> torch.Tensor | None:
    """(B|1, 1|H, c, K) -> broadcastable to the scores' (B, H_kv, rep, c, K)."""
    if ok is None or ok.shape[1] == 1:
        return None if ok is None else ok.unsqueeze(2)
    return ok.reshape(ok.shape[0], h_kv, rep, *ok.shape[2:])


def choose_route(req: AttentionRequest, query: torch.Tensor) -> str:
    """The request's route; for "auto", "exact" or "lse" (see the module docstring)."""
    if req.route != "auto":
        return req.route
    if query.dtype == torch.float32 and not query.is_cuda:   # the common CPU case, decided in one test
        return "exact"
    if not lse_kernel_available(query):
        return "exact"
    # Measured on CPU (docs/benchmarks.md): exact is faster in float32 and in bfloat16 too. But
    # its output is not sdpa's: in float32 it differs by ~1e-7, in half precision by whole
    # rounding steps, enough to change a generation (the bf16 tests of tests/test_sdar.py,
    # test_llada2.py, test_llada_moe.py). So half precision takes the lse route, whose output
    # is sdpa's own: observing a generation never changes it.
    return "lse" if query.device.type == "cuda" or query.dtype != torch.float32 else "exact"


def _capture(
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
    chunk = req.query_chunk or max(16, CHUNK_BYTES // (4 * b * h * s_k))
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
            z = _one_in_empty_rows(scores.sum(dim=-1, keepdim=True) + (0.0 if sink_num is None else sink_num), empty)
            sums.add_unblocked(scores.reshape(shape), 1.0 / z.reshape(shape[:3]), start, end, k0, k1)
            ok_blocked = _per_kv_head(allowed[:, :, start:end, k0:k1], h_kv, rep)
            z = _one_in_empty_rows(scores.masked_fill_(~ok_blocked, 0.0).sum(dim=-1, keepdim=True), empty)
            if bool((z < 1e-30).any()):
                # A blocked key held (almost) all the mass: the others underflowed relative to its
                # score. Rare; redo this chunk's softmax over the allowed keys alone, exactly.
                scores, sink_num = softmax_with_sink_(scores_of(start, end, k0, k1), ok_blocked, sink)
                sink_num = _no_sink_in_empty_rows(sink_num, empty)
                z = _one_in_empty_rows(scores.sum(dim=-1, keepdim=True), empty)
            z = z if sink_num is None else z + sink_num
            probs = scores.div_(z)
        elif lse is not None:
            probs = probs_from_lse_(scores, lse[..., start:end], ok)
        else:
            probs, sink_num = softmax_with_sink_(scores, ok, sink)
            sink_num = _no_sink_in_empty_rows(sink_num, empty)
            z = probs.sum(dim=-1, keepdim=True)
            z = _one_in_empty_rows(z if sink_num is None else z + sink_num, empty)
            probs = probs.div_(z)  # (B, H_kv, rep, c, K) float32
        if out is not None:
            out[:, :, :, start:end] = torch.matmul(probs.to(value.dtype), v[..., k0:k1, :])
        sums.add(probs.reshape(shape), start, end, k0, k1)
        if sink_num is not None:
            sums.add_sink((sink_num / z).reshape(shape[:3]), start, end)
        del scores, probs
    sums.store(req, module.layer_idx)
    if out is not None:
        _empty_rows_as_plain(out.view(b, h, s_q, d), allowed, value, mods)


def _one_in_empty_rows(z: torch.Tensor, empty: torch.Tensor | None) -> torch.Tensor:
    """A softmax normaliser (..., c, 1) with 1 in the rows that may see no key: their numerators are all
    0, so their probabilities stay 0 (no 0/0). Every other row's normaliser is >= 1 (its max is exp(0))."""
    return z if empty is None else z.masked_fill(empty, 1.0)


def _no_sink_in_empty_rows(sink_num: torch.Tensor | None, empty: torch.Tensor | None) -> torch.Tensor | None:
    """A learned sink takes nothing from a row that may see no key: that row is not summed at all."""
    return sink_num if sink_num is None or empty is None else sink_num.masked_fill(empty, 0.0)


def _empty_rows_as_plain(out: torch.Tensor, allowed: torch.Tensor | None, value: torch.Tensor, mods: Modifiers) -> None:
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


def _whole_layer_applies(req: AttentionRequest, mods: Modifiers, query: torch.Tensor, key: torch.Tensor) -> bool:
    """A small layer whose captures `_capture_whole` records: received, groups and the unblocked
    softmax (the readouts that need the chunk loop's sums — maps, diagonal, distance — and learned
    sink logits take the chunk loop)."""
    b, h, s_q, _ = query.shape
    return (req.query_chunk is None and b * h * s_q * key.shape[2] <= SMALL_SCORES and mods.sinks is None
            and not req.map_slices and not req.diagonal and not req.distance)


def _capture_whole(
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
            z = _one_in_empty_rows(probs.sum(dim=-1, keepdim=True), empty)  # (B, H, S_q, 1)
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
        _empty_rows_as_plain(out, allowed, value, mods)
    out = out.transpose(1, 2)  # (B, S_q, H, D)
    return out if s_q == 1 else out.contiguous()  # one query row: already contiguous


def _as_float32(x: torch.Tensor) -> torch.Tensor:
    return x if x.dtype == torch.float32 else x.float()


def _column_sums(p: torch.Tensor, rows: torch.Tensor | None) -> torch.Tensor:
    """(B, H, S_k) sums of p (B, H, S_q, S_k) over the summed rows (`row_matrix`'s row 0; None: all rows)."""
    if rows is None:
        return p[:, :, 0] if p.shape[2] == 1 else p.sum(dim=2)   # one query row (ARM decoding): the row itself
    return torch.matmul(rows[:, :, :1], p)[:, :, 0]


# Keyword arguments transformers' attention modules pass that this function implements, and those
# that say nothing about the attention itself (they ride along in every model's **kwargs). Any
# other one with a value is refused: computing the attention without it would silently differ.
IMPLEMENTED = ("scaling", "dropout", "is_causal", "sliding_window", "softcap", "s_aux", "output_attentions", "sinklens")
PASSIVE = ("position_ids", "cache_position", "use_cache", "output_router_logits", "output_hidden_states",
           "return_dict", "encoder_hidden_states", "token_type_ids",
           "deterministic")  # ModernBERT: a flash-attention reproducibility switch


@dataclass(frozen=True)
class Modifiers:
    """What a layer changes about plain softmax(q k^T * scaling + mask) attention."""

    softcap: float | None = None  # Gemma2: logits -> cap * tanh(logits / cap) before the mask
    sinks: torch.Tensor | None = None  # (H,) gpt-oss: a learned logit per head that joins the softmax, no value

    @property
    def sdpa_can(self) -> bool:
        """sdpa (and so the fused lse and triton kernels) has neither softcapping nor sink logits."""
        return self.softcap is None and self.sinks is None


NO_MODIFIERS = Modifiers()
KNOWN_KWARGS = frozenset(IMPLEMENTED + PASSIVE)


def modifiers(module: torch.nn.Module, kwargs: dict) -> Modifiers:
    """The layer's modifiers from the call's kwargs; one line naming any argument we do not implement."""
    for name, val in kwargs.items():
        if name in KNOWN_KWARGS or val is None or val is False:
            continue
        shown = f"a {type(val).__name__}" if isinstance(val, torch.Tensor) else repr(val)
        raise ValueError(f"{type(module).__name__} (layer {getattr(module, 'layer_idx', '?')}) passes {name}={shown} "
                         "to its attention function, which the sinklens attention does not implement")
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
    check_window(module, kwargs.get("sliding_window"), attention_mask, s_k, is_causal)
    # None where this layer blocks no key: its attention runs as unmasked (its received is its ranking source)
    blocked = req.blocked_for(module.layer_idx, (b, h, s_k)) if req is not None else None
    if req is not None and (req.value_norms or req.qk_norms):   # readouts of q, k, v themselves: any route
        record_vectors(req, module.layer_idx, query, key, value, req.query_mask)
    if req is None or (blocked is None and not req.needs_probabilities):
        return plain(module, query, key, value, attention_mask, is_causal, mods, dropout=dropout, scaling=scaling, **kwargs)
    if dropout > 0.0:
        raise ValueError("sinklens capture/mask modes are for inference; got attention dropout > 0 (model in training mode?)")

    scaling = d**-0.5 if scaling is None else scaling
    allowed = unblocked = allowed_keys(attention_mask, is_causal, s_q, s_k, query.device)
    blocked = None if blocked is None else blocked.to(query.device)
    blocking = req.capture and blocked is not None  # record what the keys would have received too
    route = choose_route(req, query) if req.needs_probabilities else "plain"
    if route == "triton" and (req.diagonal or req.distance):
        route = "lse"  # the fused kernel returns column sums only; the diagonal and distance need the chunks
    if route == "exact" and _whole_layer_applies(req, mods, query, key) and not (blocked is not None and req.keep_self):
        out = _capture_whole(module, query, key, value, allowed, blocked, scaling, req, mods)
        if out is not None:
            return out, None
    if blocked is not None:
        allowed = apply_blocking(allowed, blocked, req.keep_self, s_q, s_k)
    if blocked is not None and route != "exact":
        # Mask only and the lse / triton routes give sdpa the blocked keys as a float additive mask.
        attention_mask, is_causal = additive(allowed, query.dtype, sdpa=True), False  # eager: plain() remakes its own

    if route == "plain":
        return plain(module, query, key, value, attention_mask, is_causal, mods, dropout=dropout, scaling=scaling, **kwargs)
    if route == "triton":
        out = triton_route.capture(module, query, key, value, attention_mask, scaling, is_causal, blocked, req) \
            if mods.sdpa_can else None
        if out is not None:
            return out, None
        route = "lse"  # where the kernel does not apply
    if route == "lse":
        if mods.sdpa_can:
            out, lse = fused_sdpa_with_lse(query, key, value, attention_mask, scaling, is_causal)
        else:  # the model's own output (eager); its softmax, with the modifiers, is redone per chunk
            (out, _), lse = plain(module, query, key, value, attention_mask, is_causal, mods, dropout=dropout,
                                  scaling=scaling, **kwargs), None
        # a query that may see no key has no finite lse: such chunks take the softmax instead
        _capture(module, query, key, value, allowed, unblocked, scaling, req, None,
                 None if empty_rows(allowed) is not None else lse, mods, blocking)
        return out, None
    h_kv = key.shape[1]
    out = torch.empty(b, h_kv, h // h_kv, s_q, d, dtype=query.dtype, device=query.device)
    _capture(module, query, key, value, allowed, unblocked, scaling, req, out, None, mods, blocking)
    return out.reshape(b, h, s_q, d).transpose(1, 2).contiguous(), None  # (B, S_q, H, D)


def register() -> str:
    """Register the sinklens attention (and its mask function); idempotent. Returns the name."""
    AttentionInterface.register(ATTENTION_NAME, sinklens_attention)
    # sdpa_mask gives a bool mask (or None where sdpa's own is_causal suffices), which is what
    # both our sdpa fast path and our capture path expect.
    AttentionMaskInterface.register(ATTENTION_NAME, sdpa_mask)
    return ATTENTION_NAME
