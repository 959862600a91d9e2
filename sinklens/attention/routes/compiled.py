"""The "compiled" route: output and captures in one pass of the project's own C kernel (onepass.c).

Per (batch row, head, tile of query rows): the scores of the keys the tile can see, the row max, our
vectorised exp and the row sum, one pass that adds each row weighted by 1 / (its sum) to the column
sums, then the output from the unnormalised rows, scaled by the same 1 / sum. The two products are the
kernel's own register-blocked loops over a kv head's keys and values packed once (head sizes that
are multiples of PANEL), BLAS otherwise. One tile's scores are all the memory it adds: nothing per
layer is bigger than the sums themselves. It records everything the exact route does but full maps:
query groups, blocked keys with the would-be sums, padding / sliding windows / blocks (any mask shared
by the heads), learned sinks, soft-capping, the diagonal and distance readouts; float32, bfloat16 and
float16 inputs (converted to float32; the output is rounded back). CPU only; built on first use
(build.py), else unavailable in one note line. A forward's capture buffers are made at its first layer
for all its layers (`_Plan`).
"""
from __future__ import annotations

import ctypes
import struct
from pathlib import Path
from typing import NamedTuple

import torch

from sinklens.attention.reduce import LayerSums, row_weights
from sinklens.attention.routes import build
from sinklens.attention.routes.base import Call, Records, Route
from sinklens.attention.routes.exact import empty_rows_as_plain

def tile_rows(s_k: int, every_key: bool = False) -> int:
    """Query rows per tile where BLAS makes the products (head sizes not a multiple of PANEL). BLAS
    packs the keys anew for every sgemm, so a tile must be tall enough to amortise that; a causal tile
    also computes the scores of the keys its first rows cannot see, which grow with its height.
    Measured per layer (one thread, the best of 3-7 calls against sdpa's): bidirectional (8 heads,
    D 64), tiles of 256 / 512 rows cost 1.19 / 1.10x at S = 1024, 1.10 / 1.07x at S = 2048 and
    1.08 / 1.04x at S = 4096 (1024 rows: 1.13x at S = 2048); causal (SmolLM2's 9 / 3 heads),
    0.86 / 0.97x at S = 1024 and 1.00 / 1.04x at S = 2048. `every_key`: every row sees every key
    (bidirectional, no mask), 512 rows; else 256 from 512 keys on. At most 16 MB of scores per thread."""
    if s_k <= 512:
        return 512
    return max(64, min(512 if every_key else 256, 2**22 // s_k))


# The kernel's own products work on panels of this many keys (onepass.c `pack_keys`), and on head
# sizes that are multiples of it (16 output columns at a time)
PANEL = 16


def l2_bytes() -> int:
    """This CPU's L2 cache per core (Linux: sysfs), else 512 KiB; read once."""
    global _L2
    if _L2 is None:
        _L2 = 512 * 1024
        for index in sorted(Path("/sys/devices/system/cpu/cpu0/cache").glob("index*")):
            try:
                if (index / "level").read_text().strip() == "2":
                    size = (index / "size").read_text().strip().upper()   # "2048K"
                    unit = _UNITS.get(size[-1:])   # (an empty or unitless size: no unit, int() reads or refuses it)
                    _L2 = int(size[:-1]) * unit if unit else int(size)
                    break
            except (OSError, ValueError):
                break
    return _L2


_L2: int | None = None
_UNITS = {"K": 1 << 10, "M": 1 << 20}


def packed_rows(s_k: int, every_key: bool = False, l2: int | None = None) -> int:
    """Query rows per tile where the kernel's own products run (keys and values packed once per head,
    so a short tile costs no repacking): 48, fewer past L2 / (4 * 48) keys (24 at most from twice that),
    so that a tile's scores stay about L2-sized (`l2`: bytes per core, default this CPU's); `every_key`
    (no causal waste in a tall tile) 96, fewer past as many keys. A multiple of the 12 rows the products
    take at a time with AVX-512 (two blocks of 6 without). Per layer against sdpa (`benchmarks/bench_layer.py
    --tiles`, D 64): on an AVX2 EPYC with 512 KiB of L2, causal tiles of 24-48 rows were the fastest at
    S = 512-4096, 96 rows 3-15 % slower; bidirectional ones of 48 and 96 rows were within the noise of
    each other (± 0.04-0.08), and 96 read the head's keys and values half as often. On an AVX-512 Xeon with
    2 MiB, 30 causal rows at S = 4096 cost 1.17x sdpa, 48 rows 0.99x."""
    floats = (l2_bytes() if l2 is None else l2) // 4
    cap, budget = (96, 2 * floats) if every_key else (48, floats)
    return min(cap, max(24, budget // max(s_k, 1))) // 12 * 12


# A layer whose largest tile's two products (scores, output) take at most this many multiply-adds runs
# them as the kernel's own vector loops, without BLAS: on a tiny twin (S of a few dozen, D 32) BLAS'
# per-call setup and its thread-count switch cost more than the arithmetic. Measured per layer (6
# heads, one thread, a noisy host): the loops 59 / 147 / 254 us against BLAS 66 / 120 / 288 us at
# S = 36 / 64 / 96, D 32, and slower from S = 128 on: the crossover lies between 36 and 64 (2^17: S <= 45
# at D 32, a decoding row up to 2048 keys at D 64).
SMALL_WORK = 1 << 17

# How a layer's two products are made (onepass.c sl_args.products): BLAS; the kernel's plain vector
# loops (a small layer, SMALL_WORK); its register-blocked loops over keys and values packed once per
# kv head
PRODUCTS = {"blas": 0, "loops": 1, "packed": 2}


def products_for(tile: int, s_q: int, s_k: int, d: int) -> str:
    """How a layer's products are made: "loops" where the largest tile's two products take at most
    SMALL_WORK multiply-adds, "packed" where the head size is a multiple of PANEL, else "blas"."""
    if 2 * min(tile, s_q) * s_k * d <= SMALL_WORK:
        return "loops"
    return "packed" if d % PANEL == 0 else "blas"


_P = ctypes.c_void_p
_I, _F, _L = ctypes.c_int, ctypes.c_float, ctypes.c_int64


class _Args(ctypes.Structure):
    """onepass.c's sl_args, field for field."""
    _fields_ = [("b", _I), ("h", _I), ("h_kv", _I), ("s_q", _I), ("s_k", _I), ("d", _I),
                ("scale", _F), ("softcap", _F),
                ("q", _P), ("k", _P), ("v", _P), ("out", _P),
                ("q_strides", _L * 3), ("kv_strides", _L * 3), ("v_strides", _L * 3),
                ("causal", _I), ("allowed", _P), ("allowed_bstride", _L),
                ("blocked", _P), ("keep_self", _I), ("sinks", _P), ("row_w", _P), ("groups", _P), ("num_groups", _I),
                ("received", _P), ("unblocked", _P), ("group_sums", _P), ("sink_sums", _P),
                ("diagonal", _P), ("distance", _P),
                ("tile", _I), ("threads", _I), ("sgemm", _P), ("blas_threads", _P), ("products", _I)]


# The same layout as one struct format (native alignment, as the C compiler lays sl_args out): a layer
# writes every field with one `pack_into` (a ctypes attribute per field cost a tiny twin's layer ~15 µs
# inside a generation, where every Python object touched is a cache miss)
_CODES = {_I: "i", _F: "f", _P: "P", _L: "q"}
_PACK = struct.Struct("@" + "".join(f"{t._length_}{_CODES[t._type_]}" if issubclass(t, ctypes.Array) else _CODES[t]
                                    for _, t in _Args._fields_))


def _rows(t: torch.Tensor, dense: bool = False) -> tuple[torch.Tensor, tuple[int, int, int]]:
    """t (B, heads, S, D) as float32 with unit stride along D, and its (batch, head, row) strides.
    dense: rows also D apart (a head's rows one block). Keys and values arrive as views of the
    projections' (B, S, heads, D) output, a head's rows H_kv * D apart; BLAS packs them anew for every
    tile, and from such rows a whole SmolLM2 forward at S = 4096 took 4.5 ± 1.3 % longer than from a
    copy (one thread, 6 paired rounds; no difference at S = 1024). The copy is 2 S H_kv D floats, which
    a layer's S^2 work makes nothing. A small layer's own loops read them where they are; the packed
    products read the keys and values once, into their panels, so only BLAS needs the copies."""
    t = t if t.dtype == torch.float32 else t.float()
    stride = t.stride()   # one call: a tiny model's layer is a few dozen µs, each call counts
    if stride[3] != 1 or stride[2] < t.shape[3] or (dense and stride[2] != t.shape[3]):
        t = t.contiguous()
        stride = t.stride()
    return t, stride[:3]


class _Shared(NamedTuple):
    """What every layer of a forward passes the kernel alike (a tuple: a layer unpacks it in one step)."""

    s_k: int
    groups: torch.Tensor | None     # the request's query groups it was made for (compared by identity)
    version: int | None             # ... and their in-place version
    as_long: torch.Tensor | None    # the groups as int64, kept alive for C
    args: _Args                     # the buffer every layer packs its fields into
    tile: int                       # tile_rows(s_k)
    wide_tile: int                  # tile_rows(s_k, every_key=True): a layer whose every row sees every key
    threads: int
    sgemm: int
    blas_threads: int
    groups_ptr: int


def _shared(req, s_k: int) -> _Shared:
    """The forward's `_Shared`, made at its first layer and kept on the request, which lives one forward
    (remade where the groups were replaced or edited, or the key count differs)."""
    groups = req.query_groups
    version = None if groups is None else groups._version
    shared = req._scratch.get("compiled")
    if shared is None or shared.s_k != s_k or shared.groups is not groups or shared.version != version:
        as_long = None if groups is None else groups.to(torch.int64).contiguous()
        sgemm, blas_threads = build.blas()
        shared = req._scratch["compiled"] = _Shared(s_k, groups, version, as_long, _Args(), tile_rows(s_k),
                                                    tile_rows(s_k, True), torch.get_num_threads(), sgemm or 0,
                                                    blas_threads or 0,
                                                    0 if as_long is None else as_long.data_ptr())
    return shared


class _Plan(NamedTuple):
    """A forward's capture buffers for all its layers, made at its first layer (kept on the request):
    per layer the views the request records and their addresses for the kernel. A tiny twin's layer
    paid ~15 µs making its buffers one by one (`LayerSums.for_request`), a fifth of its capture. For
    what every layer of a forward shares (received, its query groups, the would-be sums of blocked
    keys, the rows' weights); a layer of another shape or that asks for more (learned sinks, in-pass
    readouts, keys right-aligned, maps) makes its own."""

    shape: tuple[int, int, int, int]   # (B, H, S_q, S_k) of the layers it serves
    received: tuple | None             # per layer (B, H, S_k) views; None: not asked
    groups: tuple | None               # per layer (B, G, H, S_k) views
    unblocked: list                    # [per layer (B, H, S_k) views], made at the first layer that blocks
    addresses: list                    # per layer [received, unblocked, groups] data pointers (0: none)
    weight: int                        # the query rows' weights (B, S_q) float, 0: every row counts
    weight_tensor: torch.Tensor | None  # ... kept alive for C
    ran: set                           # layers run with it: one run again is a new forward (a new plan)


def _plan(req, layer: int, shape: tuple[int, int, int, int], device) -> _Plan | None:
    """The forward's `_Plan` for `layer` of `shape` (B, H, S_q, S_k), made at its first layer; None where
    the layer makes its own buffers (the request asks for more than a plan holds, or the layer's shape
    is not the plan's)."""
    if (req.num_layers is None or layer >= req.num_layers or req.num_keys is not None or req.diagonal
            or req.distance or req.map_slices):
        return None
    plan = req._scratch.get("plan")
    if plan is None or layer in plan.ran:   # the forward's first layer (or a second forward with this request)
        b, h, _, s_k = shape
        received = req.all_layer_sums("received", (b, h, s_k), device) if req.capture else None
        groups = (req.all_layer_sums("groups", (b, req.num_groups, h, s_k), device)
                  if req.query_groups is not None else None)
        weight, _ = row_weights(req, device, groups=False)
        addresses = [[0 if received is None else received[l].data_ptr(), 0,
                      0 if groups is None else groups[l].data_ptr()] for l in range(req.num_layers)]
        plan = req._scratch["plan"] = _Plan(shape, received, groups, [], addresses,
                                            0 if weight is None else weight.data_ptr(), weight, set())
    elif plan.shape != shape:
        return None
    plan.ran.add(layer)
    return plan


def _unblocked(req, plan: _Plan, layer: int, device) -> int:
    """The address of `layer`'s would-be sums in the plan, its buffer made at the first layer that blocks."""
    if not plan.unblocked:
        b, h, _, s_k = plan.shape
        views = req.all_layer_sums("unblocked", (b, h, s_k), device)
        plan.unblocked.append(views)
        for l, v in enumerate(views):
            plan.addresses[l][1] = v.data_ptr()
    return plan.addresses[layer][1]


class Compiled(Route):
    name = "compiled"
    records = Records(groups=True, blocking=True, keep_self=True, masks=True, maps=False, learned_sinks=True,
                      softcap=True, readouts=frozenset({"diagonal", "distance"}), devices=frozenset({"cpu"}))
    auto = frozenset({("cpu", torch.float32)})

    def available(self, call: Call) -> bool:
        return call.query.is_cpu and build.load() is not None

    def run(self, call: Call) -> torch.Tensor | None:
        lib = build.load()
        # without a mask, the kernel knows causal rows itself: the (S_q, S_k) bools are never made
        allowed = None if call.attention_mask is None else call.allowed
        if allowed is not None and allowed.shape[1] != 1:
            return None  # a per-head mask: the torch routes
        query, key, value, req = call.query, call.key, call.value, call.req
        b, h, s_q, d = query.shape
        h_kv, s_k = key.shape[1], key.shape[2]
        _, _, _, _, args, tile, wide_tile, threads, sgemm, blas_threads, groups = _shared(req, s_k)   # (a _Shared)
        every_key = allowed is None and not call.is_causal   # no causal waste in a tall tile
        if every_key:
            tile = wide_tile
        products = products_for(tile, s_q, s_k, d)
        if products == "packed":   # no keys or values packed anew per tile: short tiles
            tile = packed_rows(s_k, every_key)
        q, qs = _rows(query)
        k, ks = _rows(key, dense=products == "blas")
        v, vs = _rows(value, dense=products == "blas")
        causal = allowed is None and call.is_causal and s_q > 1
        allowed = None if allowed is None else allowed.contiguous()
        blocked = None if call.blocked is None else call.blocked.contiguous()
        sinks = None if call.mods.sinks is None else call.mods.sinks.float().contiguous()
        layer, blocking = call.module.layer_idx, call.blocking
        plan = None if sinks is not None else _plan(req, layer, (b, h, s_q, s_k), query.device)
        out = torch.empty(b, s_q, h, d, dtype=torch.float32)
        if plan is not None:   # the forward's buffers, made at its first layer
            received, unblocked, group_sums = plan.addresses[layer]
            if blocking:
                unblocked = _unblocked(req, plan, layer, query.device)
            weight, learned_sink, diagonal, distance = plan.weight, 0, 0, 0
        else:
            sums = LayerSums.for_request(req, layer, b, h, s_q, s_k, blocking, query.device, sinks is not None,
                                         group_of=False)
            # a buffer not asked for is NULL to the kernel (inline tests: a helper call per pointer counts here)
            received = 0 if sums.received is None else sums.received.data_ptr()
            unblocked = 0 if sums.unblocked is None else sums.unblocked.data_ptr()
            group_sums = 0 if sums.groups is None else sums.groups.data_ptr()
            weight = 0 if sums.weight is None else sums.weight.data_ptr()
            learned_sink = 0 if sums.learned_sink is None else sums.learned_sink.data_ptr()
            # with the distance profile on, the diagonal is its bin 0
            distance = 0 if sums.distance is None else sums.distance.sums.data_ptr()
            diagonal = 0 if distance or sums.diagonal is None else sums.diagonal.data_ptr()
        _PACK.pack_into(
            args, 0, b, h, h_kv, s_q, s_k, d, call.scaling, call.mods.softcap or 0.0,
            q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), *qs, *ks, *vs,
            int(causal), 0 if allowed is None else allowed.data_ptr(),
            0 if allowed is None or allowed.shape[0] == 1 else s_q * s_k,
            0 if blocked is None else blocked.data_ptr(), int(req.keep_self), 0 if sinks is None else sinks.data_ptr(),
            weight, groups, req.num_groups, received, unblocked, group_sums, learned_sink, diagonal, distance,
            tile, threads, sgemm, blas_threads, PRODUCTS[products])
        if lib.sl_attention(ctypes.byref(args)) != 0:
            return None  # out of memory in C: the torch routes
        if plan is None:
            sums.store(req, layer)
        else:
            req.record(layer, received=None if plan.received is None else plan.received[layer],
                       unblocked=plan.unblocked[0][layer] if blocking else None,
                       groups=None if plan.groups is None else plan.groups[layer])
        out = out if query.dtype == torch.float32 else out.to(query.dtype)
        # rows that may see no key: only under a mask, or causal with more queries than keys (no mask
        # made for a causal layer whose every row sees its own key)
        if call.mods.softcap is not None and (allowed is not None or s_q > s_k):
            empty_rows_as_plain(out.transpose(1, 2), call.allowed, value, call.mods)
        return out
