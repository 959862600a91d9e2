"""One query chunk's attention probabilities, and their reduction to what a capture records.

Scores arrive in float32 as (B, H_kv, rep, c, K): c queries of the chunk against the K keys
[k0, k1) some of them can see. Two ways to turn them into probabilities:

- `softmax_with_sink_`: the row max, then exp (the exact route, and any row whose normaliser is unknown);
- `probs_from_lse_`: exp(s - lse) with the per-query log-sum-exp a fused sdpa kernel returned
  (the lse route: one pass, no row max, no normaliser).

Both clamp before exp: torch's CPU exp is 40-300x slower on inputs below about -87 (the
result underflows to denormals or 0), which is what masked scores (finfo.min) and the far tail
of a peaked softmax are. exp(-80) = 1.8e-35 is still a normal float32 and, next to a row that
sums to >= 1, changes nothing a float32 sum can see; masked scores are zeroed after the exp.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

CLAMP = -80.0
NEG = torch.finfo(torch.float32).min
SKEW_ROWS = 64  # query rows per skewed diagonal sum of the distance profile (measured best of 16 .. 128 and all)


def softmax_with_sink_(
    scores: torch.Tensor, ok: torch.Tensor | None, sink: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """In place: unnormalised softmax numerators exp(s - max over allowed), 0 where not `ok`.

    sink: the logit of a learned sink (gpt-oss), broadcastable to (..., 1): a virtual key that
    joins the softmax (and the max) but has no value; None = none. Returns (numerators, the
    sink's numerator exp(sink - max) (..., 1) or None); the normaliser is their sum.
    """
    if ok is not None:
        scores.masked_fill_(~ok, NEG)  # so that a masked score never wins the max
    top = scores.amax(dim=-1, keepdim=True)  # (..., 1)
    if sink is not None:
        top = torch.maximum(top, sink)
    scores.sub_(top).clamp_(min=CLAMP).exp_()
    if ok is not None:
        scores.masked_fill_(~ok, 0.0)
    return scores, None if sink is None else (sink - top).exp()


def probs_from_lse_(scores: torch.Tensor, lse: torch.Tensor, ok: torch.Tensor | None) -> torch.Tensor:
    """In place: probabilities exp(s - lse) (lse: (..., c) per query), 0 where not `ok`."""
    # max=1: s - lse <= 0 up to rounding, but a masked score may be anything
    scores.sub_(lse[..., None]).clamp_(min=CLAMP, max=1.0).exp_()
    if ok is not None:
        scores.masked_fill_(~ok, 0.0)
    return scores


def _masks_key(req, device) -> tuple:
    """What the query rows' weights depend on: the masks themselves (compared by identity: a request
    reused with other masks gets new weights), their in-place versions (edited masks too), the device."""
    mask, groups = req.query_mask, req.query_groups   # (no generator: this runs in every layer)
    return (device, req.num_groups, None if mask is None else mask._version, None if groups is None else groups._version)


def _cached(req, slot: str, device):
    """The value cached in `req.<slot>` if the request's masks are the ones it was made from, else None."""
    cached = getattr(req, slot)
    if cached is None:
        return None
    key, masks, value = cached
    if key == _masks_key(req, device) and masks[0] is req.query_mask and masks[1] is req.query_groups:
        return value
    return None


def _all_rows_count(req) -> bool:
    # a mask where every row counts weighs nothing: plain sums (an ARM's one decoding row, every step)
    return req.query_mask is None or bool(req.query_mask.all())


def row_weights(req, device, groups: bool = True) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(weight (B, S_q) float, group_of (B, S_q, G) float) of the request's query rows, or None each.

    The same for every layer of a forward, so made once per request and device (on a tiny model
    remaking them was a tenth of a layer's capture time); remade when the masks change.
    groups=False: group_of may be None (not made): the compiled kernel reads the group ids themselves."""
    out = _cached(req, "_row_weights", device)
    if out is not None and (out[1] is not None or not groups or req.query_groups is None):
        return out
    weight = None if _all_rows_count(req) else req.query_mask.to(device).float()
    group_of = None
    if groups and req.query_groups is not None:
        # id -1 (no group) -> an all-zero row: shift by one, drop column 0
        ids = (req.query_groups.to(device) + 1).clamp(min=0)
        group_of = torch.nn.functional.one_hot(ids, req.num_groups + 1)[..., 1:].float()  # (B, S_q, G)
        if weight is not None:
            group_of = group_of * weight[..., None]
    req._row_weights = (_masks_key(req, device), (req.query_mask, req.query_groups), (weight, group_of))
    return weight, group_of


def row_matrix(req, device) -> torch.Tensor | None:
    """(B, 1, 1 + G, S_q) float: row 0 the query rows' weights (1 = real), then one row per query
    group (1 where the row is in it and counts), so that one batched matmul with a layer's
    (B, H, S_q, S_k) probabilities sums every row set at once; None when every row counts and there
    are no groups. Made once per forward, as `row_weights` (the chunk loop's form of the same)."""
    cached = _cached(req, "_row_matrix", device)
    if cached is not None:
        return cached[0]
    every = _all_rows_count(req)
    rows = None
    if not (every and req.query_groups is None):
        w = req.query_mask.to(device)[:, None, :] if not every else None                     # (B, 1, S_q) bool
        if req.query_groups is None:
            rows = w.float()
        else:
            g = req.query_groups.to(device)                                                    # (B, S_q)
            member = g[:, None, :] == torch.arange(req.num_groups, device=device)[:, None]     # (B, G, S_q)
            if w is None:
                w = torch.ones_like(member[:, :1])
            rows = torch.cat([w, member & w], dim=1).float()                                    # (B, 1 + G, S_q)
        rows = rows.unsqueeze(1)                                                               # (B, 1, 1 + G, S_q)
    req._row_matrix = (_masks_key(req, device), (req.query_mask, req.query_groups), (rows,))
    return rows


@dataclass
class SkewScratch:
    """`OffsetSums`' scratch buffer, kept on the request and reused by every layer of a forward: a
    buffer of a few MB made anew per layer comes from the OS as fresh pages (glibc maps large
    blocks), and touching them first cost ~2 % of a SmolLM2 forward at S = 1024 (docs/benchmarks.md)."""

    buf: torch.Tensor | None = None  # (B, H, P + 1, >= P + S_k)
    pad: int = 0                     # P: zero columns left of every row (the most rows of a chunk so far)
    dirty: int = 0                   # columns from here on are zero in every row


class OffsetSums:
    """One layer's sums of A[i, j] by offset j − i (i: the query row's key position), chunk by chunk:
    the distance profile folds them into |i − j|, and offset 0 is the diagonal.

    A chunk's diagonals are summed by skewing, not by a scatter over every (row, key): its
    (weighted) rows are written once into a scratch buffer of rows P + S_k wide whose first P
    columns are zero (P >= c), then re-read with a row stride one longer, which shifts row r left
    by r: each column of that view is one diagonal of the chunk (or a zero of the padding), and
    one sum over rows gives every diagonal at once. Two passes over the chunk in all, taken
    SKEW_ROWS rows at a time: the view reads (rows) x (K + rows − 1) entries, twice the chunk's
    when rows ≈ K, and a small buffer stays in cache (measured: docs/benchmarks.md).
    """

    def __init__(self, b: int, h: int, s_k: int, offset: int, device, scratch: SkewScratch | None = None) -> None:
        self.s_k, self.offset = s_k, offset                             # query row r is key position r + offset
        self.sums = torch.zeros(b, h, 2 * s_k - 1, dtype=torch.float32, device=device)   # index j − i + S_k − 1
        self.scratch = SkewScratch() if scratch is None else scratch    # shared by a forward's layers

    @property
    def pad(self) -> int:
        return self.scratch.pad

    def _scratch(self, p: torch.Tensor) -> torch.Tensor:
        """The scratch buffer for chunk p (B, H, c, K), with zeros wherever its skewed view reads
        outside the chunk: the first P columns (never written) and the c − 1 columns right of it
        (zero unless an earlier chunk, of this layer or an earlier one, had more keys)."""
        b, h, c, k = p.shape
        sc = self.scratch
        if (sc.buf is None or c > sc.pad or sc.buf.shape[:2] != (b, h) or sc.buf.shape[-1] < sc.pad + self.s_k
                or sc.buf.device != p.device):  # once per forward: the first rows are the most
            sc.pad = c
            sc.buf = torch.zeros(b, h, c + 1, c + self.s_k, dtype=torch.float32, device=p.device)
            sc.dirty = c
        end = sc.pad + k
        if sc.dirty > end:  # an earlier chunk saw more keys: its columns past this one's are stale
            sc.buf[..., end:sc.dirty].zero_()
        sc.dirty = end
        return sc.buf

    def add(self, p: torch.Tensor, weight: torch.Tensor | None, start: int, k0: int) -> None:
        """Add chunk p (B, H, c, K), query rows from `start`, keys from `k0`; weight (B, 1, c, 1) or None."""
        for r in range(0, p.shape[2], SKEW_ROWS):
            self._add_rows(p[:, :, r:r + SKEW_ROWS], None if weight is None else weight[:, :, r:r + SKEW_ROWS],
                           start + r, k0)

    def _add_rows(self, p: torch.Tensor, weight: torch.Tensor | None, start: int, k0: int) -> None:
        b, h, c, k = p.shape
        buf = self._scratch(p)                                          # (B, H, P + 1, P + S_k)
        rows = buf[:, :, :c, self.pad:self.pad + k]
        if weight is None:
            rows.copy_(p)
        else:
            torch.mul(p, weight, out=rows)
        # view column m, row r: buf[r, r + m + 1 + P − c], the chunk's entry with j − r = m + 1 − c
        s = buf.stride()
        skew = buf.as_strided((b, h, c, k + c - 1), (s[0], s[1], s[2] + 1, 1),
                              buf.storage_offset() + 1 + self.pad - c)
        # j − r = 1 − c is absolute offset k0 + (1 − c) − (start + offset)
        lo = k0 - start - self.offset - c + self.s_k
        self.sums[..., lo:lo + k + c - 1] += skew.sum(2)

    def diagonal(self) -> torch.Tensor:
        """(B, H) the sums at offset 0."""
        return self.sums[..., self.s_k - 1]

    def binned(self) -> torch.Tensor:
        """(B, H, S_k) the sums by distance |j − i| = 0 .. S_k − 1."""
        z = self.s_k - 1
        d = self.sums[..., z:].clone()                                  # offsets 0 .. S_k − 1
        d[..., 1:] += self.sums[..., :z].flip(-1)                       # offsets −1 .. −(S_k − 1)
        return d


@dataclass(slots=True)   # (made for every layer, as the Call)
class LayerSums:
    """What one layer's capture accumulates, chunk by chunk (all float32)."""

    received: torch.Tensor | None  # (B, H, S_k) column sums over (weighted) query rows; None = not asked
    learned_sink: torch.Tensor | None  # (B, H) what a learned sink logit took, summed over the same rows; None = no sink
    unblocked: torch.Tensor | None  # (B, H, S_k) the same for the softmax before blocking; None = no blocking
    groups: torch.Tensor | None  # (B, G, H, S_k) column sums per query group
    weight: torch.Tensor | None  # (B, S_q) float 1 = real query row, 0 = not; None = every row
    group_of: torch.Tensor | None  # (B, S_q, G) one-hot group membership (already times `weight`)
    maps: dict[int, torch.Tensor] = field(default_factory=dict)  # head -> (B, S_q, S_k) full map
    # readouts (sinklens/attention/readouts.py): query row r sits at key position r + offset (the
    # queries are the last S_q positions: a full forward has offset 0, a cached step S_k − S_q)
    diagonal: torch.Tensor | None = None  # (B, H) sum over real rows of A[i, i]; None = not asked
    distance: OffsetSums | None = None  # sums over real rows of A[i, j] by j − i, binned by |i − j| at store
    offset: int = 0
    s_q: int = 0

    @classmethod
    def for_request(cls, req, layer: int, b: int, h: int, s_q: int, s_k: int, unblocked: bool, device,
                    learned_sink: bool = False, group_of: bool = True):
        """The layer's buffers for what `req` asks; group_of=False: no one-hot membership (a route that
        reads the group ids itself)."""
        f32 = dict(dtype=torch.float32, device=device)   # torch.zeros(..., **f32): no helper call per buffer
        weight, group_of = row_weights(req, device, group_of)
        return cls(
            received=req.layer_sums("received", layer, (b, h, s_k), device) if req.capture else None,
            learned_sink=torch.zeros(b, h, **f32) if req.capture and learned_sink else None,
            unblocked=req.layer_sums("unblocked", layer, (b, h, s_k), device) if unblocked else None,
            groups=req.layer_sums("groups", layer, (b, req.num_groups, h, s_k), device)
            if req.query_groups is not None else None,
            weight=weight,
            group_of=group_of,
            maps={hd: torch.zeros(b, s_q, s_k, **f32) for (ly, hd) in req.map_slices if ly == layer}
            if req.map_slices else {},
            diagonal=torch.zeros(b, h, **f32) if req.diagonal else None,
            distance=OffsetSums(b, h, s_k, s_k - s_q, device, req._scratch.setdefault("skew", SkewScratch()))
            if req.distance else None,
            offset=s_k - s_q,
            s_q=s_q,
        )

    def _column_sums(self, p: torch.Tensor, start: int, end: int) -> torch.Tensor:
        """(B, H, K) sum of p (B, H, c, K) over the chunk's real query rows."""
        if self.weight is None:
            return p.sum(dim=2)
        return torch.einsum("bhqk,bq->bhk", p, self.weight[:, start:end])

    def add(self, p: torch.Tensor, start: int, end: int, k0: int, k1: int) -> None:
        """Add the chunk's probabilities p (B, H, c, K) of queries [start, end), keys [k0, k1)."""
        if self.received is not None:
            self.received[..., k0:k1] += self._column_sums(p, start, end)
        if self.groups is not None:
            self.groups[..., k0:k1] += torch.einsum("bhqk,bqg->bghk", p, self.group_of[:, start:end])
        for hd, m in self.maps.items():
            m[:, start:end, k0:k1] = p[:, hd]
        if self.diagonal is not None and self.distance is None:  # else: the distance's bin 0 (store)
            self._add_diagonal(p, start, k0)
        if self.distance is not None:
            self.distance.add(p, None if self.weight is None else self.weight[:, None, start:end, None], start, k0)

    def _row_weight(self, p: torch.Tensor, rows: slice) -> torch.Tensor:
        """(B, 1, n, 1) weights of query rows `rows` (1 = real), to broadcast over p (B, H, n, K)."""
        if self.weight is None:
            return torch.ones(1, 1, 1, 1, device=p.device)
        return self.weight[:, None, rows, None]

    def _add_diagonal(self, p: torch.Tensor, start: int, k0: int) -> None:
        """Add A[i, i] of the chunk's rows: row r's own key sits at column start + r + offset − k0."""
        o = start + self.offset - k0
        d = torch.diagonal(p, offset=o, dim1=-2, dim2=-1)              # (B, H, n): rows max(0, −o) ...
        if d.shape[-1] == 0:
            return
        first = start + max(0, -o)
        self.diagonal += (d * self._row_weight(p, slice(first, first + d.shape[-1]))[..., 0]).sum(-1)

    def add_sink(self, share: torch.Tensor, start: int, end: int) -> None:
        """Add the learned sink's share (B, H, c) of the chunk's query rows [start, end)."""
        if self.learned_sink is not None:
            w = share if self.weight is None else share * self.weight[:, None, start:end]
            self.learned_sink += w.sum(dim=-1)

    def add_unblocked(self, num: torch.Tensor, inv_z: torch.Tensor, start: int, end: int, k0: int, k1: int) -> None:
        """Add the chunk's softmax before blocking: numerators num (B, H, c, K) times 1/Z (B, H, c).

        Weighting rows instead of dividing keeps the buffer free for the blocked softmax.
        """
        w = inv_z if self.weight is None else inv_z * self.weight[:, None, start:end]
        self.unblocked[..., k0:k1] += torch.einsum("bhqk,bhq->bhk", num, w)

    def store(self, req, layer: int) -> None:
        req.record(layer, received=self.received, unblocked=self.unblocked, groups=self.groups, maps=self.maps,
                   learned_sink=self.learned_sink)
        if self.diagonal is not None:
            # with the distance profile on, its bin 0 is that same sum: every A[i, j] with j = i, same weights
            diagonal = self.diagonal if self.distance is None else self.distance.diagonal()
            rows = self.s_q if self.weight is None else self.weight.sum(-1).clamp(min=1.0)[:, None]  # Q per row
            req.record_readout("diagonal", layer, diagonal / rows, aligned=False)
        if self.distance is not None:
            d = self.distance.binned()                                 # (B, H, S_k): distances 0 .. S_k − 1
            if req.num_keys is not None:  # a layer that saw only the last keys: its longer distances got nothing
                d = torch.nn.functional.pad(d, (0, req.num_keys - d.shape[-1]))
            req.record_readout("distance", layer, d, aligned=False)
