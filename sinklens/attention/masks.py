"""Which keys each query may see: causal / padding masks, blocked keys, and per-chunk views.

All masks here are bool, True = "may attend". Shapes broadcast as (B or 1, 1 or H, S_q, S_k).
"""
from __future__ import annotations

import torch


def allowed_keys(
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


def apply_blocking(
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


def first_free(blocked: torch.Tensor) -> torch.Tensor:
    """blocked (..., S_k) bool -> (...,) int32: the first key not blocked, S_k where every key is."""
    free = ~blocked
    return torch.where(free.any(-1), free.int().argmax(-1), blocked.shape[-1]).int()


def blocked_row_bias(blocked: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """apply_blocking for calls where every query may see every key (bidirectional without padding, one
    decoding query) and no query keeps its own key: the mask is then the same for every query row, so it
    is made once per head, as sdpa's additive mask with a query axis of 1 to broadcast (the same values
    `additive(apply_blocking(...))` gives each row, without its (B, H, S_q, S_k) tensors).

    blocked (..., S_k) bool -> (bias (..., 1, S_k): 0 = attend, finfo.min = blocked, all 0 in a head whose
    every key is blocked (apply_blocking gives such a row its keys back); first_free (...,) int32)."""
    first = first_free(blocked)
    some_free = (first < blocked.shape[-1])[..., None]
    bias = torch.zeros(blocked.shape, dtype=dtype, device=blocked.device).masked_fill_(
        blocked & some_free, torch.finfo(dtype).min)
    return bias.unsqueeze(-2), first


def additive(allowed: torch.Tensor, dtype: torch.dtype, sdpa: bool = False) -> torch.Tensor:
    """The float additive mask for `allowed`: 0 = attend, finfo.min = do not (transformers' eager mask).

    sdpa: a row that may see no key gets -inf, as sdpa makes of a bool mask, so that sdpa's output
    there is 0 as for the bool mask (a row of finfo.min would come out uniform over every key).
    """
    bias = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
    bias = bias.masked_fill(~allowed, torch.finfo(dtype).min)
    empty = empty_rows(allowed) if sdpa else None
    return bias if empty is None else bias.masked_fill_(empty, float("-inf"))


def empty_rows(allowed: torch.Tensor | None) -> torch.Tensor | None:
    """(B|1, 1|H, S_q, 1) bool: the query rows that may see no key (a left pad under a causal mask, a
    pad's row under Dream's), or None when every row sees one."""
    if allowed is None:
        return None
    empty = ~allowed.any(dim=-1, keepdim=True)
    return empty if bool(empty.any()) else None


def chunk_view(
    allowed: torch.Tensor | None, start: int, end: int, s_k: int
) -> tuple[torch.Tensor | None, int, int, torch.Tensor | None]:
    """The chunk's rows of `allowed`, cut to the key columns some of its queries can see.

    Returns (ok, k0, k1, empty): keys outside [k0, k1) are invisible to every query of the chunk
    (the future of a causal chunk, left padding), so they are never multiplied, let alone
    exponentiated. ok is (B|1, 1|H, c, k1 - k0) bool, or None when every key in range is allowed.
    empty (B|1, 1|H, c, 1) marks the rows that may see no key at all, or is None: such a row has no
    probabilities (all 0, never 0/0), as sdpa gives it no output; a chunk of such rows alone keeps
    one key column so that the shapes hold.
    """
    if allowed is None:
        return None, 0, s_k, None
    ok = allowed[:, :, start:end]  # (B|1, 1|H, c, S_k)
    seen = ok.flatten(0, 2).any(dim=0).nonzero()  # key indices some query of the chunk may see
    k0, k1 = (int(seen[0]), int(seen[-1]) + 1) if len(seen) else (0, 1)
    ok = ok[..., k0:k1]
    if bool(ok.all()):
        return None, k0, k1, None
    return ok, k0, k1, empty_rows(ok)
