"""Write a trace: steps held and written in groups (FLUSH_STEPS below), one Arrow record batch per group.

Usable on its own (tests build synthetic traces without a model):

    with TraceWriter("run.arrow", {"family": "llada", "prompt": "hi"}) as w:
        w.write_step(0, tokens=ids, is_masked=m, revealed=r, received=rec)   # rec (B, L, H, S)

and as a sampler hook (`after_step(event)`, see sinklens/samplers/steps.py). The schema (with the
run metadata) is written at the first step, so a sampler may still `update_meta(...)` until
then. `close()` writes the end-of-stream marker; a run that dies inside the `with` block is
left without it (its finished steps written), so readers report it as truncated and load its
finished steps. Steps reach the disk in groups: a kill -9 loses at most the last second of
steps (FLUSH_SECONDS; a step slower than that, any large model's, is written when it ends).

The work is done when a group is written, not while the sampler waits: at a step the hook keeps
the step's tensors (a copy of the canvas, which a sampler may change in place later; the captures
as the request stacks them, layer first, moved off an accelerator); the group's write turns each
column into one array for all its steps (one stack, one cast), decides for all of them at once
where `received` is the sum of the groups, and finds the group's new token ids in one pass.
"""
from __future__ import annotations

import json
import os
import sys
import time
import zlib
from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping

import numpy as np
import pyarrow as pa

from sinklens._version import __version__
from sinklens.trace.readouts import COLUMN_NAMES, COLUMNS
from sinklens.trace.schema import CHECKSUM_KEY, SCHEMA_VERSION, UNITS, VOCAB_KEY, build_schema

# Steps are held in memory and written together: at most FLUSH_STEPS steps, FLUSH_SECONDS since the
# last write or FLUSH_BYTES of attention arrays, whichever comes first (the end of the run and an
# error write them too). A kill -9 loses at most that much; a step slower than FLUSH_SECONDS (any
# large model) is written as soon as it ends. Writing one step at a time cost a tiny model ~0.7 ms
# per step, a fifth of its forward (docs/benchmarks.md, "Trace capture").
FLUSH_STEPS = 64
FLUSH_SECONDS = 1.0
FLUSH_BYTES = 64 * 2**20
SINK_BUFFER = 2**20  # bytes gathered before they reach the file (a group larger than this is written as it comes)


def _np(x) -> np.ndarray | None:
    """A numpy view of a tensor / array / list (None passes through)."""
    if x is None or type(x) is np.ndarray:
        return x
    if hasattr(x, "detach"):  # torch.Tensor, without importing torch here
        if x.is_cpu and not x.requires_grad and str(x.dtype) != "torch.bfloat16":
            return x.numpy()
        x = x.detach().to("cpu")
        if str(x.dtype) == "torch.bfloat16":
            x = x.float()
        x = x.numpy()
    return np.asarray(x)


def _batched(x, ndim: int) -> np.ndarray | None:
    """Add the batch axis when a single row (ndim - 1 dims) was given."""
    x = _np(x)
    if x is not None and x.ndim == ndim - 1:
        x = x[None]
    if x is not None and x.ndim != ndim:
        raise ValueError(f"expected an array with {ndim} dims (batch first) or {ndim - 1}, got shape {x.shape}")
    return x


def _own(x):
    """A copy of an array, or of each array of a list (None passes through)."""
    if x is None:
        return None
    if isinstance(x, list):
        return [_own(a) for a in x]
    return np.array(x, copy=True)


def _held(x, copy: bool = False):
    """A sampler's tensor kept until its group is written, on the CPU: one on an accelerator is
    copied now (its device memory is not held); a CPU tensor is kept as it is, or copied with `copy`
    (a canvas the sampler may change in place after the step). None passes through."""
    if x is None or not hasattr(x, "detach"):
        return np.array(x, copy=True) if copy and x is not None else x
    if not x.is_cpu:
        return x.to("cpu")
    return x.clone() if copy else x


def _batch_first(x: np.ndarray, layer_axis: int, lead: int = 0) -> np.ndarray:
    """A view of a capture held layer first ([T,] L, B, ...) with its layer axis moved `layer_axis`
    places on (1: (B, L, ...); 2: groups (L, B, G, ...) -> (B, G, L, ...)); `lead`: leading axes (steps)."""
    if layer_axis == 1:
        return x.swapaxes(lead, lead + 1)
    return np.moveaxis(x, lead, lead + layer_axis)


def _stack(xs: list) -> np.ndarray | None:
    """One (T, ...) numpy array of T arrays or tensors of one shape (None where the shapes differ): a
    sampler's tensors in one torch.stack and one conversion (torch is loaded where there are tensors)."""
    torch = sys.modules.get("torch")
    if torch is not None and all(isinstance(x, torch.Tensor) for x in xs):
        return _np(torch.stack(xs)) if len({x.shape for x in xs}) == 1 else None
    arrays = [_np(x) for x in xs]
    return np.stack(arrays) if len({a.shape for a in arrays}) == 1 else None


def _is_sum_of(received: np.ndarray, groups: np.ndarray) -> bool:
    """True when received (B, L, H, S) is the sum of groups (B, G, L, H, S) up to float32 rounding
    (every counted query row in exactly one group: the masked / unmasked split)."""
    total = groups.astype(np.float32).sum(axis=1)
    if total.shape != received.shape:
        return False
    # np.allclose's own test, without its per-call overhead (a tenth of a tiny model's step);
    # np.allclose itself decides only what this cannot (inf, nan)
    if bool((np.abs(total - received) <= 1e-5 + 1e-4 * np.abs(received)).all()):
        return True
    return bool(np.allclose(total, received, rtol=1e-4, atol=1e-5))


def _groups_cover_rows(req) -> bool:
    """True when every summed query row of the request is in a query group (the masked / unmasked
    split): its received attention is then the groups' sum, which the reader derives (schema 2)."""
    covered = req.query_groups >= 0  # (B, S_q)
    if req.query_mask is not None:
        covered = covered | ~req.query_mask.bool()
    return bool(covered.all())


def _list_column(rows: list[np.ndarray | None], value_type: pa.DataType) -> pa.Array:
    """A list<value_type> column from one flat numpy array per row (None = null row)."""
    if all(r is None for r in rows):
        return pa.nulls(len(rows), pa.list_(value_type))
    lengths = [0 if r is None else r.size for r in rows]
    offsets = np.zeros(len(rows) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    flat = [r.reshape(-1) for r in rows if r is not None]
    values = np.concatenate(flat) if flat else np.zeros(0)
    values = _as(values, _NUMPY[value_type])
    mask = pa.array([r is None for r in rows]) if any(r is None for r in rows) else None
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values, type=value_type), mask=mask)


_NUMPY = {pa.float16(): np.float16, pa.float32(): np.float32, pa.int32(): np.int32, pa.bool_(): np.bool_}


def _as(values: np.ndarray, dtype) -> np.ndarray:
    """values (flat) as `dtype`. float32 -> float16 goes through torch where a sampler has loaded it:
    numpy's cast costs ~2 ns a value and ~100 ns for one below float16's normal range (9 % of the tiny
    twins' group sums: 10 ns a value on average), torch's ~0.1 ns. The bits are the same for every
    float32 but signalling NaNs (NaN either way; checked over all 2^32 patterns)."""
    torch = sys.modules.get("torch")
    if dtype is np.float16 and values.dtype == np.float32 and torch is not None:
        return torch.from_numpy(np.ascontiguousarray(values)).half().numpy()
    return values.astype(dtype, copy=False)


def _sums_of_groups(received: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """(T,) bool: `_is_sum_of` for each step of received (T, B, L, H, S) and groups (T, B, G, L, H, S),
    in one test."""
    total = groups.astype(np.float32, copy=False).sum(axis=2)
    if total.shape != received.shape:
        return np.zeros(len(received), dtype=bool)
    ok = (np.abs(total - received) <= 1e-5 + 1e-4 * np.abs(received)).reshape(len(received), -1).all(axis=1)
    for t in np.flatnonzero(~ok):  # what the fast test refuses gets `_is_sum_of`'s own answer (inf, nan)
        ok[t] = _is_sum_of(received[t], groups[t])
    return ok


def _column(parts, rows: list[int], value_type: pa.DataType) -> pa.Array:
    """A list<value_type> column of a group, one cell per (step, row). parts: one (T, B, ...) array
    (a diffusion run's steps have one shape: one cast for the group), or per step a (B, ...) array
    (a cell per row, flat row-major), a list of its rows (None: a null cell) or None (null cells)."""
    if type(parts) is np.ndarray:
        values = parts.reshape(-1)
        offsets = np.arange(sum(rows) + 1, dtype=np.int32) * (values.size // sum(rows))
        return pa.ListArray.from_arrays(pa.array(offsets), pa.array(_as(values, _NUMPY[value_type]), type=value_type))
    if all(p is None for p in parts):
        return pa.nulls(sum(rows), pa.list_(value_type))
    cells = []
    for p, b in zip(parts, rows):
        cells.extend([None] * b if p is None else p)
    return _list_column(cells, value_type)


def _real_positions(masks) -> pa.Array:
    """The query_positions column where no step names them: each row's real positions (its
    attention mask's). masks: (T, B, S) in one pass, or per step (B, S)."""
    if type(masks) is not np.ndarray:
        return _list_column([np.flatnonzero(row) for m in masks for row in m], pa.int32())
    real = masks.reshape(-1, masks.shape[-1])  # (T * B, S)
    row, position = np.nonzero(real)
    offsets = np.zeros(len(real) + 1, dtype=np.int32)
    np.cumsum(np.bincount(row, minlength=len(real)), out=offsets[1:])
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(position.astype(np.int32), type=pa.int32()))


def event_arrays(event) -> dict:
    """A sampler's StepEvent as `write_step`'s arrays, batch first (attention arrives layer-first)."""
    req = event.attention
    received = received_groups = blocked = unblocked = learned_sink = None
    maps = None
    if req is not None:
        groups = req.received_groups
        # where the groups cover every summed row (the masked / unmasked split), received is their
        # sum: left out, the reader derives it (schema 2), and it is never copied off the device
        if req.has_received and not (groups is not None and _groups_cover_rows(req)):
            received = _np(req.received).transpose(1, 0, 2, 3)  # (L,B,H,S) -> (B,L,H,S)
        if groups is not None:
            received_groups = _np(groups).transpose(1, 2, 0, 3, 4)  # (L,B,G,H,S) -> (B,G,L,H,S)
        if req.blocked is not None:
            blocked = _np(req.blocked).transpose(1, 0, 2, 3)  # (L,B,H,S) -> (B,L,H,S)
            if req.has_received_unblocked:
                unblocked = _np(req.received_unblocked).transpose(1, 0, 2, 3)
        maps = req.maps or None
        if req.learned_sink is not None:
            learned_sink = _np(req.learned_sink).transpose(1, 0, 2)  # (L,B,H) -> (B,L,H)
    readouts = {}
    if req is not None:
        for name in req.readout_names:                # (L, B, ...) -> (B, L, ...)
            readouts[name] = np.moveaxis(_np(req.readout(name)), 0, 1)
        if req.lens is not None:
            readouts.update(lens_positions=req.lens["positions"], lens_tokens=req.lens["tokens"],
                            lens_probs=req.lens["probs"])
    return dict(tokens=event.tokens, is_masked=event.is_masked, revealed=event.revealed,
                attention_mask=getattr(event, "attention_mask", None),
                query_positions=getattr(event, "query_positions", None),
                received=received, received_groups=received_groups, blocked=blocked, maps=maps,
                received_unblocked=unblocked, learned_sink=learned_sink,
                edited=getattr(event, "edited", None), readouts=readouts)


def read_back(arrays: dict, received_dtype: str = "float16", row: int = 0) -> dict:
    """What `Trace` reads back for batch row `row` of a step written with `write_step(**arrays)`,
    without the file: the stored precision (received, groups and per-key readouts in
    `received_dtype`), received as the sum of its groups where the writer leaves it out, each
    column in the reader's dtype and shape. Keys: tokens, is_masked, attention_mask,
    query_positions, received (None: not captured), received_groups, learned_sink, edited, readouts."""
    value = {"float16": np.float16, "float32": np.float32}[received_dtype]
    stored = {"received": value, "float32": np.float32, "int32": np.int32}
    tokens = _batched(arrays["tokens"], 2)
    B, S = tokens.shape
    mask = _batched(arrays.get("attention_mask"), 2)
    mask = np.ones((B, S), bool) if mask is None else mask
    masked = _batched(arrays.get("is_masked"), 2)
    q = arrays.get("query_positions")
    if q is None:
        q = np.flatnonzero(mask[row])
    elif isinstance(q, (list, tuple)):
        q = _np(q[row]).reshape(-1)
    else:
        q = _batched(q, 2)[row]
    received, groups = _batched(arrays.get("received"), 4), _batched(arrays.get("received_groups"), 5)
    as_stored = lambda x: x[row].reshape(-1).astype(value).astype(np.float32)   # noqa: E731 (the reader's float32)
    out_groups = None if groups is None else as_stored(groups).reshape(groups.shape[1:])
    if received is None:  # not captured, or left out as the groups' sum: the reader sums the groups
        out_received = None if out_groups is None else out_groups.sum(axis=0)
    elif groups is not None and _is_sum_of(received, groups):
        out_received = out_groups.sum(axis=0)                    # the writer stores none: the reader sums the groups
    else:
        out_received = as_stored(received).reshape(received.shape[1:])
    learned = _batched(arrays.get("learned_sink"), 3)
    edited = _batched(arrays.get("edited"), 2)
    kinds = {c.name: c for cols in COLUMNS.values() for c in cols}
    readouts = {}
    for name, x in (arrays.get("readouts") or {}).items():
        if x is not None:
            x = _np(x)[row]
            y = x.reshape(-1).astype(stored[kinds[name].dtype])
            readouts[name] = (y.astype(np.float32) if kinds[name].shape == "LHS" else y).reshape(x.shape)
    return dict(tokens=tokens[row].astype(np.int32), is_masked=np.zeros(S, bool) if masked is None else
                masked[row].astype(bool), attention_mask=mask[row].astype(bool),
                query_positions=np.asarray(q).astype(np.int32), received=out_received, received_groups=out_groups,
                learned_sink=None if learned is None else learned[row].astype(np.float32),
                edited=None if edited is None else edited[row].astype(bool), readouts=readouts)


# Where the layer axis of a sampler's captures goes (the request stacks them layer first): the
# file's cells are batch first, (B, L, H, S) and the groups (B, G, L, H, S). Readouts: 1 too.
REQUEST_LAYER_AXIS = {"received": 1, "received_groups": 2, "received_unblocked": 1, "blocked": 1, "learned_sink": 1}
CANVAS = ("tokens", "is_masked", "revealed", "attention_mask", "edited")  # (B, S) per step


@dataclass
class HeldStep:
    """One step waiting for its group's write. cells: column -> numpy array batch first (from
    `write_step`), a sampler's tensor (captures layer first: `layer_axis` says where their layer
    axis goes), a list of per-row arrays (query_positions, blocked) or None (null cells / defaults)."""

    step: int
    rows: int  # B
    cells: dict
    layer_axis: Mapping[str, int] = field(default_factory=dict)
    maps: Mapping[tuple[int, int], object] | None = None


class TraceWriter:
    """Append-only writer of one trace file.

    meta: run metadata (JSON-serialisable): model, family, sampler {name, args}, seed, prompt,
        mask_id, query_groups, ... . schema_version, sinklens_version, units and received_dtype
        are filled in here; num_layers / num_heads / batch_size / seq_len from the first step
        when absent.
    received_dtype: "float16" (default; ~3 significant digits, ample for sink scores) or "float32".
    decode: optional ids -> strings function; the strings of the ids that occur are stored
        (`tokens_vocab` in the metadata for the first step, per-step additions in the batch
        metadata), so a trace can be read without the tokenizer.
    """

    def __init__(self, path: str | os.PathLike, meta: Mapping | None = None, *,
                 received_dtype: str = "float16", decode: Callable[[list[int]], list[str]] | None = None,
                 flush_steps: int = FLUSH_STEPS, flush_seconds: float = FLUSH_SECONDS):
        self.path = os.fspath(path)
        self.received_dtype = received_dtype
        self.decode = decode
        self.meta = dict(meta or {})
        self.meta.update(schema_version=SCHEMA_VERSION, sinklens_version=__version__, units=UNITS,
                         received_dtype=received_dtype)
        self.num_steps = 0
        self._seen = np.zeros(0, dtype=bool)  # token id -> its string is already stored
        folder = os.path.dirname(self.path)
        if folder and not os.path.isdir(folder):   # the path's own folder, as the CLI's --out makes it
            os.makedirs(folder, exist_ok=True)
        # Buffered: Arrow's stream writer issues a small write per buffer of every column (~50 for a
        # tiny model's group: 60 µs of system calls where the group's bytes take 6 µs to serialise);
        # each group is flushed to the file as one write.
        self._sink = pa.BufferedOutputStream(pa.OSFile(self.path, "wb"), buffer_size=SINK_BUFFER)  # fails early
        self._writer: pa.ipc.RecordBatchStreamWriter | None = None
        self._schema: pa.Schema | None = None
        self.closed = False
        self.flush_steps, self.flush_seconds = flush_steps, flush_seconds
        self._pending: list[HeldStep] = []  # steps accepted but not yet written (see FLUSH_STEPS)
        self._pending_bytes = 0
        self._flushed_at = time.monotonic()
        self._canvas: dict = {}  # canvas column -> (the sampler's tensor, its version, the held copy): _canvas_copy

    # ---- metadata -------------------------------------------------------------------------
    def update_meta(self, **fields) -> None:
        """Add run metadata; only possible before the first step is written."""
        if self._writer is not None:
            raise RuntimeError("the trace metadata is written with the first step; update it before write_step")
        self.meta.update(fields)

    def _new_ids(self, tokens: list[np.ndarray]) -> list[int]:
        """Token ids of steps' `tokens` whose strings are not stored yet (decoded when written), in one
        pass: by the step that first holds them, ascending within a step (a step at a time's order)."""
        if self.decode is None:
            return []
        ids = np.concatenate([t.reshape(-1) for t in tokens])
        starts = np.cumsum([0] + [t.size for t in tokens[:-1]])  # where each step's ids begin
        where = None
        if ids.size and int(ids.min()) < 0:  # no string for a negative id
            where = np.flatnonzero(ids >= 0)
            ids = ids[where]
        if ids.size and int(ids.max()) >= len(self._seen):  # grow the table to the largest id seen
            self._seen = np.concatenate([self._seen, np.zeros(int(ids.max()) + 1 - len(self._seen), dtype=bool)])
        fresh = np.flatnonzero(~self._seen[ids])  # a step mostly repeats the last one's ids: a lookup, no sets
        if not fresh.size:
            return []
        unique, first = np.unique(ids[fresh], return_index=True)
        first = fresh[first] if where is None else where[fresh[first]]  # where each new id first occurs
        new = unique[np.lexsort((unique, np.searchsorted(starts, first, side="right")))].tolist()
        self._seen[new] = True
        return new

    def _vocab(self, ids: list[int]) -> dict[str, str]:
        """id -> string of `ids`, decoded in one call."""
        return {str(i): s for i, s in zip(ids, self.decode(ids))} if ids else {}

    def _readout_columns(self, first: Iterable[str]) -> tuple[str, ...]:
        """The readout columns of this trace: those of the options the metadata declares (its
        `readouts`) and any the first step records."""
        declared = [c.name for option in (self.meta.get("readouts") or {}) for c in COLUMNS.get(option, ())]
        return tuple(n for n in COLUMN_NAMES if n in declared or n in first)

    def _start(self, tokens: np.ndarray, layers_heads: tuple[int, int] | None, readouts: Iterable[str]) -> None:
        """Write the schema with the run metadata: at the first step, whose token strings it holds."""
        vocab = self._vocab(self._new_ids([tokens]))
        self.meta.setdefault("batch_size", int(tokens.shape[0]))
        self.meta.setdefault("seq_len", int(tokens.shape[1]))
        if layers_heads is not None:
            self.meta.setdefault("num_layers", int(layers_heads[0]))
            self.meta.setdefault("num_heads", int(layers_heads[1]))
        if vocab:
            self.meta["tokens_vocab"] = {**self.meta.get("tokens_vocab", {}), **vocab}
        try:
            self._schema = build_schema(self.meta, self.received_dtype, self._readout_columns(readouts))
        except TypeError as e:
            raise TypeError(f"trace metadata must be JSON-serialisable: {e}") from None
        self._writer = pa.ipc.new_stream(self._sink, self._schema)
        self._sink.flush()  # the schema is on disk before the first group (a run killed now reads as empty)

    # ---- steps ----------------------------------------------------------------------------
    def write_step(self, step: int, tokens, *, is_masked=None, revealed=None, attention_mask=None,
                   query_positions=None, received=None, received_groups=None, blocked=None,
                   maps: Mapping[tuple[int, int], object] | None = None, received_unblocked=None,
                   learned_sink=None, edited=None, readouts: Mapping[str, object] | None = None) -> None:
        """Write one step. Arrays are batch first; a single row may omit the batch axis.

        tokens (B, S) int; is_masked / revealed / attention_mask (B, S) bool (defaults: all
        False / all False / all True); query_positions (B, S_q) int or a list of per-row 1-D
        arrays (default: the real positions); received (B, L, H, S) float; received_groups
        (B, G, L, H, S) float; blocked (B, L, H, S) bool or a list of per-row (N, 3) int
        (layer, head, position) arrays; maps {(layer, head): (B, S_q, S_k)}; received_unblocked
        (B, L, H, S) float: what the keys would have received without the blocking (ranking source);
        learned_sink (B, L, H) float: the attention the model's learned sink logits took (gpt-oss);
        edited (B, S) bool: unmasked tokens rewritten at this step (LLaDA2.1), None = never;
        readouts {column: (B, ...) array}: mechanism readouts (sinklens/trace/readouts.py COLUMNS), each
        row stored flat in its declared row-major shape.
        """
        if self.closed:
            raise RuntimeError(f"trace {self.path} is closed")
        tokens = _batched(tokens, 2)
        B, S = tokens.shape
        is_masked = _batched(is_masked, 2) if is_masked is not None else np.zeros((B, S), bool)
        revealed = _batched(revealed, 2) if revealed is not None else np.zeros((B, S), bool)
        attention_mask = _batched(attention_mask, 2) if attention_mask is not None else np.ones((B, S), bool)
        received = _batched(received, 4)
        received_groups = _batched(received_groups, 5)
        received_unblocked = _batched(received_unblocked, 4)
        learned_sink = _batched(learned_sink, 3)
        edited = _batched(edited, 2)
        if edited is not None and edited.shape != (B, S):
            raise ValueError(f"edited must have shape {(B, S)} like tokens, got {edited.shape}")
        # received may be left out where it is the sum of the groups: then a group has its shape
        like = received if received is not None or received_groups is None else received_groups[:, 0]
        if received_unblocked is not None and (like is None or received_unblocked.shape != like.shape):
            raise ValueError("received_unblocked must have the shape of received (B, L, H, S)")
        for name, arr, want in (("is_masked", is_masked, (B, S)), ("revealed", revealed, (B, S)),
                                ("attention_mask", attention_mask, (B, S))):
            if arr.shape != want:
                raise ValueError(f"{name} must have shape {want} like tokens, got {arr.shape}")
        if received is not None and (received.shape[0] != B or received.shape[-1] != S):
            raise ValueError(f"received must have shape (B={B}, L, H, S={S}), got {received.shape}")
        if received_groups is not None and (received_groups.shape[0] != B or received_groups.shape[-1] != S):
            raise ValueError(f"received_groups must have shape (B={B}, G, L, H, S={S}), got {received_groups.shape}")
        if query_positions is None:
            qpos = None  # the real positions, found for the whole group when it is written
        elif isinstance(query_positions, (list, tuple)):
            qpos = [_np(q).reshape(-1) for q in query_positions]
        else:
            qpos = list(_batched(query_positions, 2))
        if blocked is None:
            blocked_rows = None
        elif isinstance(blocked, (list, tuple)):
            blocked_rows = [None if b is None else _np(b).reshape(-1, 3) for b in blocked]
        else:
            blocked = _batched(blocked, 4)
            blocked_rows = [np.argwhere(blocked[b]) for b in range(B)]

        readouts = dict(readouts or {})
        unknown = sorted(set(readouts) - set(COLUMN_NAMES))
        if unknown:
            raise ValueError(f"unknown readout column(s) {unknown}; known: {list(COLUMN_NAMES)}")
        readouts = {name: _np(arr) for name, arr in readouts.items() if arr is not None}
        for name, arr in readouts.items():
            if arr is not None and arr.shape[0] != B:
                raise ValueError(f"readout {name} must be batch first with {B} rows, got shape {arr.shape}")

        if self._writer is None:
            first = received if received is not None else received_groups  # (B, [G,] L, H, S)
            self._start(tokens, None if first is None else first.shape[-3:-1], readouts)
        absent = sorted(set(readouts) - set(self._schema.names))
        if absent:
            raise ValueError(f"readout column(s) {absent} were not recorded at the first step, so the trace has no "
                             "column for them: declare their options in the metadata's 'readouts'")
        L = self.meta.get("num_layers")
        H = self.meta.get("num_heads")
        for name, arr in (("received", received), ("received_groups", received_groups)):
            if arr is not None and arr.shape[-3:-1] != (L, H):
                raise ValueError(f"{name} has (L, H) = {arr.shape[-3:-1]}, the trace has ({L}, {H})")
        if learned_sink is not None and learned_sink.shape != (B, L, H):
            raise ValueError(f"learned_sink must have shape (B, L, H) = {(B, L, H)}, got {learned_sink.shape}")

        cells = dict(tokens=tokens, is_masked=is_masked, revealed=revealed, attention_mask=attention_mask,
                     query_positions=qpos, received=received, received_groups=received_groups, blocked=blocked_rows,
                     received_unblocked=received_unblocked, learned_sink=learned_sink, edited=edited, **readouts)
        nbytes = sum(a.nbytes for a in (received, received_groups, received_unblocked, *readouts.values())
                     if a is not None)
        due = self._due(nbytes + sum(_np(m).nbytes for m in (maps or {}).values()))
        if not due:  # held past this call: own copies, the caller may reuse its buffers (a tensor's .numpy() is one)
            cells = {k: _own(v) for k, v in cells.items()}
            maps = {k: _np(m).copy() for k, m in maps.items()} if maps else maps
        self._hold(HeldStep(step, B, cells, maps=maps), due)

    def _due(self, nbytes: int) -> bool:
        """Count a step's `nbytes` held bytes; True when its group is to be written with it."""
        self._pending_bytes += nbytes
        return (len(self._pending) + 1 >= self.flush_steps or time.monotonic() - self._flushed_at >= self.flush_seconds
                or self._pending_bytes >= FLUSH_BYTES)

    def _hold(self, held: HeldStep, due: bool) -> None:
        self.num_steps += 1
        self._pending.append(held)
        if due:
            self.flush()

    # ---- hook interface (see sinklens/samplers/steps.py) -----------------------------------
    def after_step(self, event) -> None:
        """Hold a sampler's StepEvent for its group's write (module docstring): all the sampler
        waits for is a copy of the canvas and the request's captures, stacked as it holds them."""
        if self.closed:
            raise RuntimeError(f"trace {self.path} is closed")
        cells = {name: self._canvas_copy(name, getattr(event, name, None)) for name in CANVAS}
        positions = getattr(event, "query_positions", None)  # per row: a 1-D tensor
        cells["query_positions"] = None if positions is None else [_held(q, copy=True) for q in positions]
        layer_axis, maps = REQUEST_LAYER_AXIS, None
        req = event.attention
        if req is not None:
            # received is kept beside the groups: where they sum to it (the masked / unmasked split)
            # the group's write leaves it out, for all the group's steps in one test
            cells["received"] = _held(req.received) if req.has_received else None
            cells["received_groups"] = _held(req.received_groups)
            if req.blocked is not None:
                cells["blocked"] = _held(req.blocked, copy=True)  # a hook's instruction: it may reuse it
                if req.has_received_unblocked:
                    cells["received_unblocked"] = _held(req.received_unblocked)
            cells["learned_sink"] = _held(req.learned_sink)
            maps = {k: _held(m) for k, m in req.maps.items()} or None
            names = req.readout_names
            if names:
                layer_axis = {**REQUEST_LAYER_AXIS, **dict.fromkeys(names, 1)}
                cells.update((name, _held(req.readout(name))) for name in names)
            if req.lens is not None:  # batch first
                cells.update(lens_positions=_held(req.lens["positions"]), lens_tokens=_held(req.lens["tokens"]),
                             lens_probs=_held(req.lens["probs"]))
        if self._writer is None:
            self._start_from(cells)
        nbytes = sum(x.nbytes for name, x in cells.items() if name not in CANVAS and hasattr(x, "nbytes"))
        nbytes += sum(m.nbytes for m in (maps or {}).values())
        self._hold(HeldStep(event.step, cells["tokens"].shape[0], cells, layer_axis, maps), self._due(nbytes))

    def _canvas_copy(self, name: str, x):
        """A held copy of the canvas tensor `x`: the previous step's copy where `x` is the same tensor,
        unchanged since (a sampler passes its padding mask, and often more, step after step)."""
        last = self._canvas.get(name)
        if last is not None and last[0] is x and last[1] is not None and x._version == last[1]:  # a tensor: versioned
            return last[2]
        held = _held(x, copy=True)
        if x is not None:
            self._canvas[name] = (x, getattr(x, "_version", None), held)
        return held

    def _start_from(self, cells: dict) -> None:
        """`_start` at a sampler's first step: (L, H) from its captures, held layer first."""
        received, groups = cells.get("received"), cells.get("received_groups")
        if received is not None:
            layers_heads = (received.shape[0], received.shape[2])  # (L, B, H, S)
        elif groups is not None:
            layers_heads = (groups.shape[0], groups.shape[3])      # (L, B, G, H, S)
        else:
            layers_heads = None
        self._start(_np(cells["tokens"]), layers_heads, [n for n in COLUMN_NAMES if cells.get(n) is not None])

    # ---- the group's write ----------------------------------------------------------------
    def _parts(self, steps: list[HeldStep], name: str):
        """Column `name` of the group's steps, batch first: one (T, B, ...) array where every step
        holds an array of one shape (one stack and one transpose for the group), else a part per step
        (a (B, ...) array, a list of per-row arrays, or None)."""
        held = [s.cells.get(name) for s in steps]
        if all(x is None for x in held):
            return held
        axes = {s.layer_axis.get(name) for s in steps}
        if len(axes) == 1 and not any(x is None or isinstance(x, list) for x in held):
            block = _stack(held)  # (T, [L,] B, ...)
            if block is not None:
                axis = axes.pop()
                return block if axis is None else _batch_first(block, axis, lead=1)
        parts = []
        for s, x in zip(steps, held):
            if x is None or isinstance(x, list):
                parts.append(x if x is None else [_np(r) for r in x])
                continue
            axis = s.layer_axis.get(name)
            parts.append(_np(x) if axis is None else _batch_first(_np(x), axis))
        return parts

    def flush(self) -> None:
        """Write the steps held in memory (one record batch for the group) and flush the file."""
        if not self._pending:
            return
        steps, self._pending, self._pending_bytes = self._pending, [], 0
        rows = [s.rows for s in steps]
        value_type = lambda name: self._schema.field(name).type.value_type  # noqa: E731
        parts = {name: self._parts(steps, name) for name in self._schema.names if name not in ("step", "row", "maps")}
        tokens = parts["tokens"]
        for name, fill in (("is_masked", False), ("revealed", False), ("attention_mask", True)):  # the defaults
            if type(parts[name]) is not np.ndarray:
                parts[name] = [np.full(t.shape, fill) if p is None else p for p, t in zip(parts[name], tokens)]
        # received is left out (null: the reader sums the groups, schema 2) where it is their sum
        received, groups = parts["received"], parts["received_groups"]
        if type(received) is np.ndarray and type(groups) is np.ndarray:  # every step holds both: one test
            derivable = _sums_of_groups(received, groups)
        else:
            derivable = [r is not None and g is not None and _is_sum_of(r, g) for r, g in zip(received, groups)]
        if all(derivable):
            parts["received"] = [None] * len(steps)
        elif any(derivable):
            parts["received"] = [None if d else r for d, r in zip(derivable, received)]
        # a sampler's blocked keys arrive as (B, L, H, S) bool: the file holds (layer, head, position) triples
        parts["blocked"] = [[np.argwhere(row) for row in b] if type(b) is np.ndarray else b for b in parts["blocked"]]
        if all(q is None for q in parts["query_positions"]):
            columns = {"query_positions": _real_positions(parts["attention_mask"])}
        else:
            columns = {"query_positions": _column([[np.flatnonzero(r) for r in m] if q is None else q for q, m in
                                                   zip(parts["query_positions"], parts["attention_mask"])],
                                                  rows, pa.int32())}
        columns.update(step=pa.array(np.repeat(np.array([s.step for s in steps], dtype=np.int32), rows)),
                       row=pa.array(np.concatenate([np.arange(b, dtype=np.int32) for b in rows])),
                       maps=self._maps_column(steps))
        for name in self._schema.names:
            if name not in columns:
                columns[name] = _column(parts[name], rows, value_type(name))
        batch = pa.record_batch([columns[f.name] for f in self._schema], schema=self._schema)
        # One record batch for the group (schema 3): Arrow's per-batch cost (buffers and metadata
        # per column, the checksum's serialisation) is paid once per group, not once per step. A
        # checksum of the batch's serialised bytes lets the reader tell damaged steps from good
        # ones (Arrow itself has none); the reader verifies a batch when it first reads a step of it.
        custom = {CHECKSUM_KEY: str(zlib.crc32(batch.serialize()))}
        vocab = self._vocab(self._new_ids(list(tokens)))  # the group's new ids, one decode
        if vocab:
            custom[VOCAB_KEY] = json.dumps(vocab)
        self._writer.write_batch(batch, custom_metadata=custom)
        self._sink.flush()
        self._flushed_at = time.monotonic()

    def _maps_column(self, steps: list[HeldStep]) -> pa.Array:
        struct_type = self._schema.field("maps").type
        if not any(s.maps for s in steps):
            return pa.nulls(sum(s.rows for s in steps), struct_type)
        rows = []
        for s in steps:
            for b in range(s.rows):
                rows.append([{"layer": int(l), "head": int(h), "values": _np(m)[b].astype(np.float32).reshape(-1)}
                             for (l, h), m in sorted(s.maps.items())] if s.maps else None)
        return pa.array(rows, type=struct_type)

    # ---- closing --------------------------------------------------------------------------
    def close(self) -> None:
        """Finish the stream (end-of-stream marker). A trace with no step still gets its schema."""
        if self.closed:
            return
        if self._writer is None:
            self._schema = build_schema(self.meta, self.received_dtype, self._readout_columns(()))
            self._writer = pa.ipc.new_stream(self._sink, self._schema)
        self.flush()
        self._writer.close()
        self._sink.close()
        self.closed = True

    def abandon(self) -> None:
        """Close the file WITHOUT the end-of-stream marker: readers will report it truncated."""
        if not self.closed:
            try:
                self.flush()  # the finished steps are kept
            except Exception:  # noqa: BLE001  (the error that abandons the run is the one to report)
                pass
            finally:
                self._sink.close()
                self.closed = True

    def __enter__(self) -> "TraceWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abandon()
