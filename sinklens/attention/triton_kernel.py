"""A fused Triton kernel: attention output and per-head column sums in one launch (extra `gpu`).

One program per (block of BLOCK_M queries, batch x head). It makes two passes over the keys
the block can see, both in on-chip memory, nothing of size S_q x S_k ever written:

1. flash attention: online softmax, the output and each query's log-sum-exp (lse);
2. column sums: p_ij = exp(s_ij - lse_i) again, summed over the block's (weighted) query rows
   and added atomically into received[b, h, j] (and received_groups[b, g, h, j] per group).

Masks: causal (lower-right aligned, so a KV cache works), key padding (B, S_k), blocked keys
(B, H, S_k) with `keep_self`. GQA: query head h reads kv head h // (H / H_kv). A query that can
see no key contributes nothing (the torch routes spread such a row uniformly, as eager does;
samplers never count those rows). `fused_attention_colsums` refuses (ValueError) a blocking
that would leave a row empty, and has no `received_unblocked`: the attention function sends
those calls to the torch routes.

Correctness is tested on CPU with TRITON_INTERPRET=1 (tests/test_triton_kernel.py) against
the exact route. No GPU was available when it was written: its speed is not measured.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _attn_colsum_kernel(
    Q, K, V, O, LSE, R, RG, KEYOK, BLOCKED, QW, QG,
    H, REP, S_Q, S_K, scale,
    D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    NUM_GROUPS: tl.constexpr, CAUSAL: tl.constexpr, HAS_KEYOK: tl.constexpr,
    HAS_BLOCKED: tl.constexpr, KEEP_SELF: tl.constexpr, HAS_R: tl.constexpr,
):
    pid_m, bh = tl.program_id(0), tl.program_id(1)
    b, h = bh // H, bh % H
    kvh = b * (H // REP) + h // REP  # flat (batch, kv head) index
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)  # query indices
    dims = tl.arange(0, BLOCK_D)
    row_ok = rows < S_Q
    q_pos = rows + S_K - S_Q  # absolute positions (lower-right alignment)
    q = tl.load(Q + (bh * S_Q + rows[:, None]) * D + dims[None, :], mask=row_ok[:, None] & (dims[None, :] < D), other=0.0)
    hi = S_K
    if CAUSAL:  # keys after the block's last query are invisible to all of it
        hi = tl.minimum(S_K, (pid_m + 1) * BLOCK_M + S_K - S_Q)

    # ---- pass 1: output and lse (online softmax) ------------------------------------------
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    for start in range(0, hi, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        kv_mask = (cols[:, None] < S_K) & (dims[None, :] < D)
        k = tl.load(K + (kvh * S_K + cols[:, None]) * D + dims[None, :], mask=kv_mask, other=0.0)
        s = tl.dot(q, tl.trans(k)).to(tl.float32) * scale  # (BLOCK_M, BLOCK_N)
        ok = _allowed(cols, q_pos, b, bh, S_K, KEYOK, BLOCKED, CAUSAL, HAS_KEYOK, HAS_BLOCKED, KEEP_SELF)
        s = tl.where(ok, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with nothing seen yet: no NaN
        p = tl.exp(s - m_use[:, None])
        alpha = tl.exp(m_i - m_use)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(V + (kvh * S_K + cols[:, None]) * D + dims[None, :], mask=kv_mask, other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v).to(tl.float32)
        m_i = m_new
    seen = l_i > 0
    out = acc / tl.where(seen, l_i, 1.0)[:, None]
    tl.store(O + (bh * S_Q + rows[:, None]) * D + dims[None, :], out.to(O.dtype.element_ty),
             mask=row_ok[:, None] & (dims[None, :] < D))
    lse = tl.where(seen, tl.where(m_i == float("-inf"), 0.0, m_i) + tl.log(tl.where(seen, l_i, 1.0)), 0.0)
    tl.store(LSE + bh * S_Q + rows, lse, mask=row_ok)

    # ---- pass 2: column sums p_ij = exp(s_ij - lse_i) over the block's rows -----------------
    w = tl.load(QW + b * S_Q + rows, mask=row_ok, other=0.0)
    w = tl.where(seen, w, 0.0)  # a row that saw no key contributes nothing
    if NUM_GROUPS > 0:
        grp = tl.load(QG + b * S_Q + rows, mask=row_ok, other=-1)
    for start in range(0, hi, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        k = tl.load(K + (kvh * S_K + cols[:, None]) * D + dims[None, :],
                    mask=(cols[:, None] < S_K) & (dims[None, :] < D), other=0.0)
        s = tl.dot(q, tl.trans(k)).to(tl.float32) * scale
        ok = _allowed(cols, q_pos, b, bh, S_K, KEYOK, BLOCKED, CAUSAL, HAS_KEYOK, HAS_BLOCKED, KEEP_SELF)
        p = tl.where(ok, tl.exp(tl.minimum(s - lse[:, None], 0.0)), 0.0)
        col_ok = cols < S_K
        if HAS_R:
            tl.atomic_add(R + bh * S_K + cols, tl.sum(p * w[:, None], 0), mask=col_ok)
        for g in tl.static_range(NUM_GROUPS):
            wg = tl.where(grp == g, w, 0.0)
            tl.atomic_add(RG + ((b * NUM_GROUPS + g) * H + h) * S_K + cols, tl.sum(p * wg[:, None], 0), mask=col_ok)


@triton.jit
def _allowed(cols, q_pos, b, bh, S_K, KEYOK, BLOCKED,
             CAUSAL: tl.constexpr, HAS_KEYOK: tl.constexpr, HAS_BLOCKED: tl.constexpr, KEEP_SELF: tl.constexpr):
    """(BLOCK_M, BLOCK_N) bool: query q_pos may see key cols."""
    ok = (cols[None, :] < S_K) & (q_pos[:, None] >= 0)
    if CAUSAL:
        ok = ok & (cols[None, :] <= q_pos[:, None])
    if HAS_KEYOK:
        ok = ok & (tl.load(KEYOK + b * S_K + cols, mask=cols < S_K, other=0) != 0)[None, :]
    if HAS_BLOCKED:
        blocked = (tl.load(BLOCKED + bh * S_K + cols, mask=cols < S_K, other=0) != 0)[None, :]
        if KEEP_SELF:
            blocked = blocked & (cols[None, :] != q_pos[:, None])
        ok = ok & ~blocked
    return ok


def fused_attention_colsums(
    query: torch.Tensor,  # (B, H, S_q, D)
    key: torch.Tensor,  # (B, H_kv, S_k, D)
    value: torch.Tensor,  # (B, H_kv, S_k, D)
    scale: float,
    causal: bool,
    key_ok: torch.Tensor | None = None,  # (B, S_k) bool: real keys (padding mask)
    blocked: torch.Tensor | None = None,  # (B, H, S_k) bool
    keep_self: bool = False,
    query_weight: torch.Tensor | None = None,  # (B, S_q) float/bool: rows that count; None = all
    query_groups: torch.Tensor | None = None,  # (B, S_q) long group ids, -1 = none
    num_groups: int = 0,
    received: bool = True,
    block_m: int = 32,
    block_n: int = 32,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """(out (B, S_q, H, D), lse (B, H, S_q), received (B, H, S_k) or None, groups (B, G, H, S_k) or None)."""
    b, h, s_q, d = query.shape
    h_kv, s_k = key.shape[1], key.shape[2]
    dev = query.device
    if blocked is not None:
        _check_no_empty_row(blocked, key_ok, causal, keep_self, s_q, s_k)
    q, k, v = query.contiguous(), key.contiguous(), value.contiguous()
    out = torch.empty_like(q)
    lse = torch.empty(b, h, s_q, dtype=torch.float32, device=dev)
    r = torch.zeros(b, h, s_k, dtype=torch.float32, device=dev)
    rg = torch.zeros(b, max(num_groups, 1), h, s_k, dtype=torch.float32, device=dev)
    qw = (torch.ones(b, s_q, device=dev) if query_weight is None else query_weight.to(dev)).float().contiguous()
    qg = (torch.full((b, s_q), -1, device=dev) if query_groups is None else query_groups.to(dev)).int().contiguous()
    keyok = (torch.ones(b, s_k, device=dev) if key_ok is None else key_ok.to(dev)).to(torch.int8).contiguous()
    blk = (torch.zeros(b, h, s_k, device=dev) if blocked is None else blocked.to(dev)).to(torch.int8).contiguous()
    grid = (triton.cdiv(s_q, block_m), b * h)
    _attn_colsum_kernel[grid](
        q, k, v, out, lse, r, rg, keyok, blk, qw, qg,
        h, h // h_kv, s_q, s_k, scale,
        D=d, BLOCK_D=triton.next_power_of_2(d), BLOCK_M=block_m, BLOCK_N=block_n,
        NUM_GROUPS=num_groups if query_groups is not None else 0, CAUSAL=causal, HAS_KEYOK=key_ok is not None,
        HAS_BLOCKED=blocked is not None, KEEP_SELF=keep_self, HAS_R=received,
    )
    groups = rg if query_groups is not None and num_groups > 0 else None
    return out.transpose(1, 2).contiguous(), lse, (r if received else None), groups


def _check_no_empty_row(blocked, key_ok, causal, keep_self, s_q, s_k) -> None:
    """The torch routes give a row whose every key is blocked its unblocked softmax back; this
    kernel cannot, so it refuses such a call (rows empty from padding alone are fine)."""
    if keep_self:
        return  # a query's own key is never blocked for it
    real = torch.ones_like(blocked) if key_ok is None else key_ok[:, None, :].bool().expand_as(blocked)
    q_pos = torch.arange(s_k - s_q, s_k, device=blocked.device)

    def empty_rows(free):  # (B, H, S_k) -> (B, H, S_q) rows that see no free key
        if not causal:
            return ~free.any(-1, keepdim=True).expand(*free.shape[:2], s_q)
        first = torch.where(free.any(-1), free.int().argmax(-1), s_k)  # first free key per (b, h)
        return q_pos[None, None, :] < first[..., None]

    if bool((empty_rows(real & ~blocked) & ~empty_rows(real)).any()):
        raise ValueError("blocking leaves some query row with no key to attend to; use the torch routes")
