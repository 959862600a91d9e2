"""A Triton kernel for the column sums of attention, from the log-sum-exp sdpa returns (extra `gpu`).

The "triton" route takes the attention output and each query's log-sum-exp (lse) from sdpa's own
fused kernel (fused.py: on a GPU the one F.sdpa itself picks), so the output keeps sdpa's bits; this kernel
then makes the one extra pass: p_ij = exp(q_i . k_j * scale - lse_i), summed over the (weighted)
query rows into received[b, h, j], and per query group into groups[b, g, h, j].

One program per (block of BLOCK_N keys, batch x head). It holds its keys on chip and walks the
query blocks that can see them, so each column sum is accumulated in registers and stored once:
no atomics, and no (S_q, S_k) tensor is ever written. The cost is one q k^T product and one exp
per visible (query, key) pair, about half of what the attention forward itself does.

Layouts: causal (lower-right aligned, as sdpa's causal with S_q = S_k), bidirectional, and any mask
the call brings (padding, blocks, windows: a bool (S_q, S_k) per batch row or head, read tile by
tile); GQA: query head h reads kv head h // (H / H_kv), keys never repeated. Blocked keys (B, H, S_k),
with or without a query keeping its own key: the sums after blocking from the blocked softmax's
lse, and in the same pass, from the unblocked lse, what every key would have received (masking
ranks on those). Calls for full maps, softcapping, learned sinks or in-pass readouts go to the lse
route (routes/triton.py declares this).

Tested on CPU with TRITON_INTERPRET=1 (tests/test_triton_kernel.py) against a float64 softmax;
benchmarks/gpu_check.py measures it on a GPU against eager attention and flash sdpa.
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from sinklens.attention import masks

# Triton's CPU interpreter (TRITON_INTERPRET=1, the tests) multiplies 16-bit tiles wrongly (a bfloat16
# q k^T off by 1e10), so there the kernel multiplies in float32; on a GPU the tiles go to the tensor
# cores as they are, products accumulated in float32
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
LOG2E = tl.constexpr(1.4426950408889634)  # exp(x) = exp2(x * log2(e)); constexpr: a kernel may read it


@triton.jit
def _colsum_kernel(
    Q, K, LSE, R, RG, QW, QG, BLOCKED, FIRST_FREE, LSE_FREE, RU, MASK, M_SB, M_SH, MASK_B, MB_SB, MB_SH,
    H, REP, S_Q, S_K, scale,
    D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    NUM_GROUPS: tl.constexpr, GROUPS_P2: tl.constexpr, CAUSAL: tl.constexpr, HAS_R: tl.constexpr, HAS_W: tl.constexpr,
    HAS_BLOCKED: tl.constexpr, KEEP_SELF: tl.constexpr, HAS_MASK: tl.constexpr, UPCAST: tl.constexpr,
    IEEE: tl.constexpr,
):
    pid_n, bh = tl.program_id(0), tl.program_id(1)
    b, h = bh // H, bh % H
    kvh = b * (H // REP) + h // REP  # flat (batch, kv head) index
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)  # key indices
    dims = tl.arange(0, BLOCK_D)
    col_ok = cols < S_K
    k = tl.load(K + (kvh * S_K + cols[:, None]) * D + dims[None, :], mask=col_ok[:, None] & (dims[None, :] < D),
                other=0.0)  # (BLOCK_N, BLOCK_D), on chip for the whole program
    if UPCAST:
        k = k.to(tl.float32)
    scale_log2 = scale * LOG2E
    acc = tl.zeros([BLOCK_N], tl.float32)
    acc_free = tl.zeros([BLOCK_N], tl.float32)  # blocked keys: the sums they would have received
    if HAS_BLOCKED:
        blk = tl.load(BLOCKED + bh * S_K + cols, mask=col_ok, other=0) != 0  # (BLOCK_N,)
        first_free = tl.load(FIRST_FREE + bh)  # the first key not blocked in this head (S_K: none)
    acc_g = tl.zeros([GROUPS_P2, BLOCK_N], tl.float32)
    g_idx = tl.arange(0, GROUPS_P2)
    lo = 0
    if CAUSAL:  # query rows before the first that sees this block's first key see none of it
        lo = tl.maximum(pid_n * BLOCK_N - (S_K - S_Q), 0) // BLOCK_M * BLOCK_M
    for start in range(lo, S_Q, BLOCK_M):
        rows = start + tl.arange(0, BLOCK_M)
        row_ok = rows < S_Q
        q = tl.load(Q + (bh * S_Q + rows[:, None]) * D + dims[None, :], mask=row_ok[:, None] & (dims[None, :] < D),
                    other=0.0)
        if UPCAST:
            q = q.to(tl.float32)
        lse = tl.load(LSE + bh * S_Q + rows, mask=row_ok, other=0.0) * LOG2E
        if HAS_W:
            w = tl.load(QW + b * S_Q + rows, mask=row_ok, other=0.0)  # padding rows and absent rows weigh 0
        else:
            w = tl.where(row_ok, 1.0, 0.0)
        if IEEE:  # float32 inputs: full float32 products (the default, tf32, is off by ~1e-3)
            s = tl.dot(q, tl.trans(k), input_precision="ieee")
        else:
            s = tl.dot(q, tl.trans(k)).to(tl.float32)
        s = s * scale_log2  # (BLOCK_M, BLOCK_N), in base 2: exp2 is the GPU's native exponential
        ok = col_ok[None, :] & row_ok[:, None]
        if CAUSAL:
            ok = ok & (cols[None, :] <= (rows + S_K - S_Q)[:, None])
        if HAS_MASK:  # the call's own mask (padding, blocks, windows): a row that sees no key adds nothing
            tile = rows[:, None] * S_K + cols[None, :]
            ok = ok & (tl.load(MASK + b.to(tl.int64) * M_SB + h.to(tl.int64) * M_SH + tile, mask=ok, other=0) != 0)
        # below, min(., 0): rounding between sdpa's lse and this product must not make a probability > 1
        if HAS_BLOCKED:
            lse_free = tl.load(LSE_FREE + bh * S_Q + rows, mask=row_ok, other=0.0) * LOG2E
            acc_free += tl.sum(tl.where(ok, tl.exp2(tl.minimum(s - lse_free[:, None], 0.0)), 0.0) * w[:, None], 0)
            if HAS_MASK:  # masks.apply_blocking's per-head mask, made beside the kernel
                ok = ok & (tl.load(MASK_B + b.to(tl.int64) * MB_SB + h.to(tl.int64) * MB_SH + tile, mask=ok, other=0) != 0)
            else:
                q_pos = rows + S_K - S_Q
                cut = blk[None, :] & ok
                if KEEP_SELF:  # a blocked key is still seen by its own query
                    cut = cut & (cols[None, :] != q_pos[:, None])
                else:  # a row whose every visible key is blocked keeps its keys (masks.apply_blocking)
                    if CAUSAL:
                        cut = cut & (q_pos >= first_free)[:, None]
                    else:
                        cut = cut & (first_free < S_K)
                ok = ok & ~cut
        p = tl.where(ok, tl.exp2(tl.minimum(s - lse[:, None], 0.0)), 0.0)
        if HAS_R:
            acc += tl.sum(p * w[:, None], 0)
        if NUM_GROUPS > 0:
            grp = tl.load(QG + b * S_Q + rows, mask=row_ok, other=-1)
            for g in tl.static_range(NUM_GROUPS):
                part = tl.sum(p * tl.where(grp == g, w, 0.0)[:, None], 0)
                acc_g = tl.where(g_idx[:, None] == g, acc_g + part[None, :], acc_g)
    if HAS_R:
        tl.store(R + bh * S_K + cols, acc, mask=col_ok)
    if HAS_BLOCKED:
        tl.store(RU + bh * S_K + cols, acc_free, mask=col_ok)
    if NUM_GROUPS > 0:
        tl.store(RG + ((b * NUM_GROUPS + g_idx[:, None]) * H + h) * S_K + cols[None, :], acc_g,
                 mask=(g_idx[:, None] < NUM_GROUPS) & col_ok[None, :])


def column_sums(
    query: torch.Tensor,  # (B, H, S_q, D)
    key: torch.Tensor,  # (B, H_kv, S_k, D)
    lse: torch.Tensor,  # (B, H, S_q) float32: each query's log-sum-exp over the keys it sees
    scale: float,
    causal: bool,  # lower-right aligned: query i sees keys j <= i + S_k - S_q
    query_weight: torch.Tensor | None = None,  # (B, S_q) float/bool: rows that count; None = all
    query_groups: torch.Tensor | None = None,  # (B, S_q) long group ids, -1 = none
    num_groups: int = 0,
    received: bool = True,
    blocked: torch.Tensor | None = None,  # (B, H, S_k) bool keys blocked per head; then lse is after blocking
    lse_free: torch.Tensor | None = None,  # (B, H, S_q) float32 lse before blocking (with `blocked`)
    keep_self: bool = False,  # a blocked key is still seen by its own query
    first_free: torch.Tensor | None = None,  # (B, H) int32 first key `blocked` leaves free (S_k: none), if known
    allowed: torch.Tensor | None = None,  # (B|1, 1|H, S_q, S_k) bool: the call's mask (then causal is False)
    allowed_blocked: torch.Tensor | None = None,  # (B, H, S_q, S_k) bool: with `allowed` and `blocked`, after blocking
    block_m: int = 64,
    block_n: int = 64,
    num_warps: int = 4,
) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """(received (B, H, S_k) float32 or None, groups (B, G, H, S_k) float32 or None, unblocked
    (B, H, S_k) float32: what each key would have received without blocking, or None).

    With `blocked`, `lse` must be the softmax's after blocking as masks.apply_blocking makes it (a
    row whose every visible key is blocked keeps them) and `lse_free` the one before."""
    b, h, s_q, d = query.shape
    h_kv, s_k = key.shape[1], key.shape[2]
    dev = query.device
    num_groups = num_groups if query_groups is not None else 0
    q, k = query.contiguous(), key.contiguous()
    lse = lse.float().contiguous()
    r = torch.empty(b, h, s_k, dtype=torch.float32, device=dev) if received else torch.empty(1, device=dev)
    rg = torch.empty(b, max(num_groups, 1), h, s_k, dtype=torch.float32, device=dev)
    none = torch.empty(1, dtype=torch.uint8, device=dev)  # what the kernel gets for an input it does not read
    qw = none if query_weight is None else query_weight.to(dev).float().contiguous()
    qg = none if num_groups == 0 else query_groups.to(dev).int().contiguous()
    if blocked is not None:
        blocked = blocked.to(dev)
        blk = blocked.contiguous().view(torch.uint8)  # bool is a byte: read as it is, not copied
        first_free = (masks.first_free(blocked) if first_free is None else first_free).contiguous()  # (B, H)
        lse_free, ru = lse_free.float().contiguous(), torch.empty(b, h, s_k, dtype=torch.float32, device=dev)
    else:
        blk = first_free = lse_free = ru = none
    mask, m_sb, m_sh = _mask_arg(allowed, dev)
    mask_b, mb_sb, mb_sh = _mask_arg(allowed_blocked if blocked is not None else None, dev)
    grid = (triton.cdiv(s_k, block_n), b * h)
    _colsum_kernel[grid](
        q, k, lse, r, rg, qw, qg, blk, first_free, lse_free, ru, mask, m_sb, m_sh, mask_b, mb_sb, mb_sh,
        h, h // h_kv, s_q, s_k, scale,
        D=d, BLOCK_D=max(16, triton.next_power_of_2(d)), BLOCK_M=block_m, BLOCK_N=block_n,
        NUM_GROUPS=num_groups, GROUPS_P2=max(1, triton.next_power_of_2(num_groups)), CAUSAL=causal,
        HAS_R=received, HAS_W=query_weight is not None, HAS_BLOCKED=blocked is not None, KEEP_SELF=keep_self, HAS_MASK=allowed is not None, UPCAST=INTERPRETED and q.dtype != torch.float32,
        IEEE=q.dtype == torch.float32 or INTERPRETED, num_warps=num_warps,
    )
    return (r if received else None), (rg if num_groups > 0 else None), (ru if blocked is not None else None)


def _mask_arg(allowed: torch.Tensor | None, dev) -> tuple[torch.Tensor, int, int]:
    """(the bool mask as bytes, rows of S_k contiguous; batch stride, head stride): a mask broadcast
    along the batch or the heads (an axis of 1, or stride 0) is read with stride 0, not copied, and a
    bool mask is read as it is (a bool is one byte)."""
    if allowed is None:
        return torch.empty(1, dtype=torch.uint8, device=dev), 0, 0
    m = allowed.to(dev)
    if m.stride(-1) != 1 or m.stride(-2) != m.shape[-1]:  # rows of S_k not laid out in a row: copy once
        m = m.contiguous()
    return m.view(torch.uint8), (0 if m.shape[0] == 1 else m.stride(0)), (0 if m.shape[1] == 1 else m.stride(1))
