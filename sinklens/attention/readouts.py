"""Mechanism readouts computed in the capture pass (the options: sinklens/trace/readouts.py).

Two homes, both inside the one forward pass that captures received attention:
- per layer inside the attention function (`record_vectors`; diagonal and distance ride the
  capture route's own pass): value norms, key norms, the q·k angle, the query norm;
- per decoder layer through forward hooks (`readout_hooks`, registered with the documented
  `nn.Module.register_forward_hook` for the length of one forward and removed after it): the
  residual stream's norm and its largest channels, and the hidden states the logit lens reads.
On the CPU, in float32, both are one call each of the compiled route's C library (onepass.c
`sl_qkv_readouts`, `sl_hidden_top`), which reads each tensor once or twice where torch's dozen
calls read it each time; the torch code below is their definition and their fallback.
  The lens runs after the forward (`finish_lens`), when every layer's received attention is known
  and the step's sink positions can be found with the rule module.

None of these changes what the model computes: hooks only read the layer outputs.
"""
from __future__ import annotations

import ctypes
from contextlib import contextmanager

import numpy as np
import torch

from sinklens.attention.routes import build
from sinklens.rule import np_rule
from sinklens.rule.spec import DEFAULT_EPS, DEFAULT_UNITS, layer_visibilities

# Channels kept per (layer, position) with hidden-state readouts: the largest |h_c|. A massive
# activation is one or two channels many times larger than the rest (arXiv 2605.06366), so a
# handful shows it and the runner-up beside it. The trace stores k; its readers take k from the row.
HIDDEN_TOP_CHANNELS = 4
LENS_TOPK = 5            # tokens kept per (lens layer, position): the top of the lens' softmax
LENS_MAX_POSITIONS = 8   # default lens positions per step: the sink positions flagged in the most heads
LENS_LOGITS = 1 << 24    # at most this many logits per LM-head call of the lens (64 MB in float32)

# The C passes' signatures (onepass.c), made once: these run at every layer of every step
_STRIDES = ctypes.c_int64 * 9   # q's, k's, v's (batch, head, row) strides
_QKV_ARGS = [ctypes.c_int] * 6 + [ctypes.c_void_p] * 3 + [_STRIDES] + [ctypes.c_void_p] * 5
_HIDDEN_ARGS = [ctypes.c_int64, ctypes.c_int, ctypes.c_int] + [ctypes.c_void_p] * 4
_MEDIAN_ARGS = [ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p]


def record_vectors(req, layer: int, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                   weight: torch.Tensor | None) -> None:
    """Value / key / query readouts of one layer.

    query (B, H, S_q, D), key and value (B, H_kv, S_k, D) as the attention function gets them
    (after RoPE, before the GQA repeat); weight (B, S_q) float real query rows or None (all).
    """
    if _compiled_vectors(req, layer, query, key, value, weight):
        return
    b, h, s_q, d = query.shape
    h_kv, s_k = key.shape[1], key.shape[2]
    per_head = lambda t: t.repeat_interleave(h // h_kv, dim=1)  # noqa: E731  kv head -> its query heads, (B, H, S_k)
    if req.value_norms:
        req.record_readout("value_norm", layer, per_head(value.float().norm(dim=-1)))
    if req.qk_norms:
        q, k = query.float(), key.float()
        q_norm = q.norm(dim=-1)                                        # (B, H, S_q)
        w = torch.ones_like(q_norm[:, 0]) if weight is None else weight.to(q.device).float()   # (B, S_q)
        n = w.sum(-1).clamp(min=1.0)[:, None]                          # (B, 1)
        # mean_i cos(q_i, k_j) = k_j · mean_i q̂_i / ||k_j||: one (S_k, D) product per kv head and its
        # query heads, never an (S_q, S_k) matrix; the norms divide the weights, not the vectors
        q_dir = torch.einsum("bhqd,bhq->bhd", q, w[:, None] / q_norm.clamp(min=1e-30)) / n[..., None]  # (B, H, D)
        k_norm = k.norm(dim=-1)                                        # (B, H_kv, S_k)
        dots = torch.einsum("bgkd,bgrd->bgrk", k, q_dir.view(b, h_kv, h // h_kv, d))   # (B, H_kv, rep, S_k)
        cos = (dots / k_norm.clamp(min=1e-30)[:, :, None]).view(b, h, s_k)
        req.record_readout("key_norm", layer, per_head(k_norm))
        req.record_readout("qk_cos", layer, cos)
        req.record_readout("query_norm", layer, torch.einsum("bhq,bq->bh", q_norm, w) / n, aligned=False)


def _compiled_vectors(req, layer: int, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      weight: torch.Tensor | None) -> bool:
    """`record_vectors` in one call of the compiled kernel (onepass.c `sl_qkv_readouts`): the same
    readouts within float32 rounding (tests/test_readouts.py). False, recording nothing, where the
    kernel is not built or the tensors are not float32 CPU tensors with unit stride along D."""
    if not all([t.device.type == "cpu" and t.dtype == torch.float32 and t.stride(-1) == 1
                for t in (query, key, value)]):
        return False
    fn = build.function("sl_qkv_readouts", _QKV_ARGS, ctypes.c_int)
    if fn is None:
        return False
    b, h, s_q, d = query.shape
    h_kv, s_k = key.shape[1], key.shape[2]
    w = None if weight is None else weight.to(torch.float32).contiguous()
    strides = _STRIDES(*query.stride()[:3], *key.stride()[:3], *value.stride()[:3])
    value_norm = torch.empty(b, h, s_k) if req.value_norms else None
    key_norm, cos, query_norm = (torch.empty(b, h, s_k), torch.empty(b, h, s_k), torch.empty(b, h)) \
        if req.qk_norms else (None, None, None)
    ptr = lambda t: None if t is None else t.data_ptr()  # noqa: E731
    if fn(b, h, h_kv, s_q, s_k, d, query.data_ptr(), key.data_ptr(), value.data_ptr(), strides, ptr(w),
          ptr(value_norm), ptr(key_norm), ptr(cos), ptr(query_norm)):
        return False
    if value_norm is not None:
        req.record_readout("value_norm", layer, value_norm)
    if key_norm is not None:
        req.record_readout("key_norm", layer, key_norm)
        req.record_readout("qk_cos", layer, cos)
        req.record_readout("query_norm", layer, query_norm, aligned=False)
    return True


def decoder_layers(model) -> list:
    """The decoder layers of a transformers model (`get_decoder().layers`), or a one-line error."""
    base = model.get_decoder() if hasattr(model, "get_decoder") else None
    layers = getattr(base, "layers", None)
    if layers is None:
        raise ValueError(f"{type(model).__name__} exposes no decoder layers (get_decoder().layers): "
                         "hidden-state readouts and the logit lens are not available for it")
    return list(layers)


@contextmanager
def readout_hooks(model, req):
    """Forward hooks on each decoder layer for one forward pass, when `req` asks for hidden-state
    readouts or a logit lens; nothing is registered otherwise."""
    if req is None or not (req.hidden_norms or req.lens_layers):
        yield
        return
    lens = set(req.lens_layers or ())
    handles = []

    def hook_for(layer: int):
        def hook(module, args, output):
            h = output[0] if isinstance(output, tuple) else output     # (B, S, D) the residual stream after the layer
            if req.hidden_norms:
                hf = h.float()
                k = min(HIDDEN_TOP_CHANNELS, hf.shape[-1])
                got = _compiled_hidden_top(hf, k)   # (norm, channels, values, median |h|), or None
                if got is None:
                    mag = hf.abs()
                    top = mag.topk(k, dim=-1).indices   # (B, S, k)
                    got = hf.norm(dim=-1), top.int(), hf.gather(-1, top), _median_rows(mag.flatten(1))
                req.record_readout("hidden_norm", layer, got[0], aligned=False)
                req.record_readout("hidden_top_channels", layer, got[1], aligned=False)
                req.record_readout("hidden_top_values", layer, got[2], aligned=False)
                # Sun et al. 2024's massive-activation ratio divides by the median magnitude of all
                # activations: one number per layer (the rows this forward computed)
                req.record_readout("hidden_median_abs", layer, got[3], aligned=False)
            if layer in lens:
                req._lens_hidden[layer] = h.detach()
        return hook

    layers = decoder_layers(model)
    bad = sorted(l for l in lens if l >= len(layers))
    if bad:
        raise ValueError(f"lens_layers {bad}: the model has {len(layers)} layers (0..{len(layers) - 1})")
    try:
        for l, layer in enumerate(layers):
            handles.append(layer.register_forward_hook(hook_for(l)))
        yield
    finally:
        for hd in handles:
            hd.remove()


def _compiled_hidden_top(hf: torch.Tensor, k: int):
    """(norm (B, S), channels (B, S, k) int32, their values (B, S, k), median |h| (B,)) of the hidden
    states hf (B, S, D) by two passes of the compiled kernel (onepass.c `sl_hidden_top`, `sl_median_abs`),
    which only read hf: torch's norm, topk, gather and median give the same channels, values and median,
    the norm within float32 rounding (tests/test_readouts.py). None where the kernel is not built, hf is
    not a contiguous float32 CPU tensor, or holds a NaN (torch's path orders it)."""
    if hf.device.type != "cpu" or hf.dtype != torch.float32 or not hf.is_contiguous():
        return None
    fn = build.function("sl_hidden_top", _HIDDEN_ARGS, ctypes.c_int)
    if fn is None:
        return None
    B, S, D = hf.shape
    norm, top, values = torch.empty(B, S), torch.empty(B, S, k, dtype=torch.int32), torch.empty(B, S, k)
    if fn(B * S, D, k, hf.data_ptr(), norm.data_ptr(), top.data_ptr(), values.data_ptr()):
        return None
    median = torch.empty(B)
    if build.function("sl_median_abs", _MEDIAN_ARGS, ctypes.c_int)(B, S * D, hf.data_ptr(), median.data_ptr()):
        return None
    return norm, top, values, median


def _median_rows(x: torch.Tensor) -> torch.Tensor:
    """(B,) torch.median of each row of x (B, N): the lower middle element. On the CPU by numpy's
    selection (np.partition), the same element at a fifteenth of torch's time there (measured: 0.36
    against 5.6 ms for 512 x 512 activations, which made it most of the hidden-state readouts' cost)."""
    if x.device.type != "cpu" or x.dtype not in (torch.float32, torch.float64):
        return x.median(dim=-1).values
    a = x.detach().numpy()
    if np.isnan(a).any():   # torch's median is NaN there, numpy's selection would not say so
        return x.median(dim=-1).values
    k = (x.shape[1] - 1) // 2
    return torch.from_numpy(np.partition(a, k, axis=-1)[:, k].copy())


def sink_positions(req, attention_layout: dict, num_keys: int, first_row: int | None = None) -> torch.Tensor:
    """(B, P) long: per batch row the positions the step's Eq. 3 sinks sit at (DEFAULT_UNITS,
    DEFAULT_EPS, the model's visibility), those flagged in the most (layer, head) first, at most
    LENS_MAX_POSITIONS; -1 pads rows with fewer. Queries: the request's real rows, S_q positions from
    `first_row` (None: the last S_q). The rule is the report's own (rule/np_rule.py), on the CPU."""
    received = req.received.float().cpu().numpy()                    # (L, B, H, S)
    L, B, _, S = received.shape
    w = req.query_mask
    s_q = S if w is None else w.shape[1]
    q0 = S - s_q if first_row is None else first_row
    rows = np.ones((B, s_q), bool) if w is None else w.bool().cpu().numpy()
    vis = layer_visibilities(L, causal=attention_layout.get("causal", False),
                             attention_block=attention_layout.get("attention_block"),
                             windows=attention_layout.get("windows"), window_kind=attention_layout.get("window_kind"))
    total = max(float(received.sum()), 1e-30)
    n = min(LENS_MAX_POSITIONS, S)
    out = np.full((B, n), -1, np.int64)
    for b in range(B):
        cov = np_rule.coverage(q0 + np.flatnonzero(rows[b]), np.ones(S, bool), vis)
        scores = np_rule.to_scores(received[:, b], DEFAULT_UNITS, cov)             # (L, H, S)
        flagged = np_rule.is_sink(scores, cov.visible[:, None, :], DEFAULT_EPS)
        count = flagged.sum(axis=(0, 1)) + received[:, b].sum(axis=(0, 1)) / total * 1e-3   # ties: more received first
        top = np.argsort(-count, kind="stable")[:n]
        out[b] = np.where(flagged.any(axis=(0, 1))[top], top, -1)
    return torch.from_numpy(out)


def finish_lens(req, head, attention_layout: dict, first_row: int | None = None) -> None:
    """The logit lens after the forward: each lens layer's hidden state at the step's positions
    through `head` (the model's final norm and LM head, (B, P, D) -> (B, P, V) logits); the top
    LENS_TOPK tokens and probabilities.

    Positions are absolute key positions. A cached forward (ARM decoding, SDAR's blocks, Fast-dLLM)
    computes hidden states only for the rows it is fed: from `first_row`, else the last S_h
    positions. Other positions read as -1 (no lens)."""
    if not req.lens_layers:
        return
    hidden = req._lens_hidden
    B, s_h = next(iter(hidden.values())).shape[:2]
    S = req.received.shape[-1] if req.has_received else s_h           # key positions of the step
    r0 = S - s_h if first_row is None else first_row                   # position of the first computed row
    if req.lens_positions is not None:
        bad = [p for p in req.lens_positions if p >= S]
        if bad:
            raise ValueError(f"lens_positions {bad}: the step has {S} positions (0..{S - 1})")
        pos = torch.tensor(list(req.lens_positions), dtype=torch.long).expand(B, -1)
    else:
        pos = sink_positions(req, attention_layout, S, first_row).cpu()   # (B, P), -1 = none
    pos = torch.where((pos >= r0) & (pos < r0 + s_h), pos, -1)          # only rows this forward computed
    take = (pos - r0).clamp(min=0)                                     # (B, P) row of each position
    layers = sorted(req.lens_layers)
    P = take.shape[1]
    # several layers' positions through the head in one call: the LM head's weights (V x D, the
    # largest matrix of a small model) are read once per call, not once per layer (measured:
    # SmolLM2's lens at every layer cost 1.4-1.9x the capture, one layer per call). The first call
    # takes one layer and shows V; the next ones as many as fit LENS_LOGITS logits.
    tokens, probs, c, per_call = [], [], 0, 1
    while c < len(layers):
        chunk = layers[c:c + per_call]
        xs = [hidden[l].gather(1, take.to(hidden[l].device)[..., None].expand(-1, -1, hidden[l].shape[-1]))
              for l in chunk]                                           # (B, P, D) per layer
        p = head(torch.cat(xs, 1)).float().softmax(dim=-1)              # (B, n * P, V)
        top = p.topk(LENS_TOPK, dim=-1)
        tokens.append(top.indices.int().unflatten(1, (len(chunk), P)))  # (B, n, P, k)
        probs.append(top.values.unflatten(1, (len(chunk), P)))
        c, per_call = c + len(chunk), max(1, LENS_LOGITS // max(1, B * P * p.shape[-1]))
    none = (pos < 0)[:, None, :, None]                                  # (B, 1, P, 1)
    req.lens = {"positions": pos.int(),
                "tokens": torch.cat(tokens, 1).cpu().masked_fill(none, -1),
                "probs": torch.cat(probs, 1).cpu().masked_fill(none, float("nan"))}
    req._lens_hidden = {}
