"""Write a trace: steps held and written in groups (FLUSH_STEPS below), one Arrow record batch per group.

Usable on its own (tests build synthetic traces without a model):

    with TraceWriter("run.arrow", {"family": "llada", "prompt": "hi"}) as w:
        w.write_step(0, tokens=ids, is_masked=m, revealed=r, received=rec)   # rec (B, L, H, S)

and as a sampler hook (`after_step(event)`, see sinklens/samplers/steps.py). The schema (with the
run metadata) is written at the first step, so a sampler may still add to `writer.meta` until
then. `close()` writes the end-of-stream marker; a run that dies inside the `with` block is
left without it (its finished steps written), so readers report it as truncated and load its
finished steps. Steps reach the disk in groups: a kill -9 loses at most the last second of
steps (FLUSH_SECONDS; a step slower than that, any large model's, is written when it ends).

The work is done when a group is written, not while the sampler waits: at a step the hook keeps
the step's tensors (a copy of the canvas, which a sampler may change in place later; the captures
as the request stacks them, layer first, moved off an accelerator); the group's write turns each
column into one array for all its steps (one stack, one cast), decides for all of them at once
where `received` is the sum of the groups, and finds the group's new token ids in one pass.

The columns are data: `TraceWriter.columns` (the core columns declared in trace/schema.py; a
subclass may declare more) and the readout columns (sinklens/columns.py). A step's arrays are
checked against each column's shape letters (B, S, L, H, G bound by the first array that has
them) in one loop (`check_step`); a StepEvent field or an AttentionRequest capture of a column's
name is its source (`event_arrays`, `after_step`); `read_back` reads every declared column. Four
columns are handled by name: query_positions and blocked (per-row lists of varying length),
received (left out where it is the sum of the groups) and maps (a list of structs). Column
building (numpy to Arrow) is trace/arrays.py's.
"""
from __future__ import annotations

import json
import os
import time
import zlib
from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping

import numpy as np
import pyarrow as pa

from sinklens._version import __version__
from sinklens.columns import Column
from sinklens.rule.spec import STORED_UNITS
from sinklens.trace.arrays import (Flat, _all_none, _batch_first, _batched, _column, _flat, _held, _int32,
                                   _is_sum_of, _np, _own, _real_positions, _row_column, _rows_of, _stack,
                                   _sums_of_groups, _typed_nulls)
from sinklens.trace.readouts import COLUMN_NAMES, COLUMNS
from sinklens.trace.schema import CHECKSUM_KEY, CORE_COLUMNS, SCHEMA_VERSION, VOCAB_KEY, build_schema

# Steps are held in memory and written together: at most FLUSH_STEPS steps, FLUSH_SECONDS since the
# last write or FLUSH_BYTES of attention arrays, whichever comes first (the end of the run and an
# error write them too). A kill -9 loses at most that much; a step slower than FLUSH_SECONDS (any
# large model) is written as soon as it ends. Writing one step at a time cost a tiny model ~0.7 ms
# per step, a fifth of its forward (docs/benchmarks.md, "Trace capture").
FLUSH_STEPS = 64
FLUSH_SECONDS = 1.0
FLUSH_BYTES = 64 * 2**20
SINK_BUFFER = 2**20  # bytes gathered before they reach the file (a group larger than this is written as it comes)
SMALL_IDS = 2**14  # a group with at most this many token ids finds its new ones in Python sets, a larger one in numpy


def _groups_cover_rows(req) -> bool:
    """True when every summed query row of the request is in a query group (the masked / unmasked
    split): its received attention is then the groups' sum, which the reader derives (schema 2)."""
    covered = req.query_groups >= 0  # (B, S_q)
    if req.query_mask is not None:
        covered = covered | ~req.query_mask.bool()
    return bool(covered.all())


RAGGED = ("query_positions", "blocked")  # per-row lists of varying length (query rows; blocked triples)


def from_request(c: Column) -> bool:
    """Whether a sampler hands column `c` as a capture of its step's request (layer first, named as
    the column) rather than as a StepEvent field of its name."""
    return c.layer_axis is not None or c.name == "blocked"


def request_capture(req, name: str):
    """The request's capture `name`, layer first (None where it holds none): received once recorded,
    received_unblocked where keys were blocked."""
    if name == "received":
        return req.received if req.has_received else None
    if name == "received_unblocked":
        return req.received_unblocked if req.blocked is not None and req.has_received_unblocked else None
    return getattr(req, name, None)


def event_arrays(event, columns: tuple[Column, ...] = CORE_COLUMNS) -> dict:
    """A sampler's StepEvent as `write_step`'s arrays, batch first (attention arrives layer-first)."""
    req = event.attention
    out = {"maps": None, "readouts": {}}
    for c in columns:
        if not from_request(c):
            out[c.name] = getattr(event, c.name, None)
            continue
        x = None if req is None else request_capture(req, c.name)
        out[c.name] = None if x is None else np.moveaxis(_np(x), 0, c.layer_axis or 1)  # (L, B, ...) -> batch first
    if req is not None:
        # where the groups cover every summed row (the masked / unmasked split), received is their
        # sum: left out, the reader derives it (schema 2)
        if out.get("received_groups") is not None and _groups_cover_rows(req):
            out["received"] = None
        out["maps"] = req.maps or None
        for name in req.readout_names:                # (L, B, ...) -> (B, L, ...)
            out["readouts"][name] = np.moveaxis(_np(req.readout(name)), 0, 1)
        if req.lens is not None:
            out["readouts"].update(lens_positions=req.lens["positions"], lens_tokens=req.lens["tokens"],
                                   lens_probs=req.lens["probs"])
    return out


_STORED = {"float32": np.float32, "int32": np.int32, "bool": np.bool_}


def read_back(arrays: dict, received_dtype: str = "float16", row: int = 0,
              columns: tuple[Column, ...] = CORE_COLUMNS) -> dict:
    """What `Trace` reads back for batch row `row` of a step written with `write_step(**arrays)`,
    without the file: every declared column but `blocked` in its stored precision (received-typed
    columns in `received_dtype`, read as float32) and the reader's dtype and shape, defaults filled
    in (query_positions: the real positions), received as the sum of its groups where the writer
    leaves it out, None for a null cell; `readouts`: {column: array}."""
    value = {"float16": np.float16, "float32": np.float32}[received_dtype]
    as_stored = lambda x, dtype: (x.astype(value).astype(np.float32) if dtype == "received"  # noqa: E731
                                  else x.astype(_STORED[dtype]))
    S = _batched(arrays["tokens"], 2).shape[1]
    out = {}
    for c in columns:
        x = arrays.get(c.name)
        if c.name in RAGGED:
            continue
        if x is None:
            out[c.name] = None if c.fill is None else np.full(S, c.fill)
            continue
        out[c.name] = as_stored(_batched(x, len(c.shape) + 1)[row], c.dtype)
    q = _query_rows(arrays.get("query_positions"))
    out["query_positions"] = (np.flatnonzero(out["attention_mask"]) if q is None else q[row]).astype(np.int32)
    received, groups = _batched(arrays.get("received"), 4), _batched(arrays.get("received_groups"), 5)
    if groups is not None and (received is None or _is_sum_of(received, groups)):
        out["received"] = out["received_groups"].sum(axis=0)  # the writer stores none: the reader sums the groups
    kinds = {c.name: c for cols in COLUMNS.values() for c in cols}
    out["readouts"] = {name: as_stored(_np(x)[row], kinds[name].dtype)
                       for name, x in (arrays.get("readouts") or {}).items() if x is not None}
    return out


def check_step(columns: tuple[Column, ...], arrays: dict, dims: dict) -> dict:
    """Each declared column's array of one step, batch first (a single row may omit the batch axis),
    checked against the column's shape letters: B, S, L, H and G agree across the columns and with
    `dims` (the first array with a letter binds it there). The ragged columns become per-row lists."""
    cells = {}
    for c in columns:
        x = arrays.get(c.name)
        if c.name == "query_positions":
            cells[c.name] = _query_rows(x)
        elif c.name == "blocked":
            cells[c.name] = _blocked_rows(x, dims["B"])
        elif x is None:
            cells[c.name] = None
        else:
            x = _batched(x, len(c.shape) + 1)
            letters = [a for a in "B" + c.shape]
            if any(a in dims and dims[a] != n for a, n in zip(letters, x.shape) if a in "BSLHG"):
                want = tuple(dims.get(a, a) if a in "BSLHG" else a for a in letters)
                raise ValueError(f"{c.name} must have shape ({', '.join(letters)}) = {want} like the step's other "
                                 f"arrays and the trace, got {x.shape}")
            dims.update((a, n) for a, n in zip(letters, x.shape) if a in "BSLHG" and a not in dims)
            cells[c.name] = x
    return cells


def _query_rows(q) -> list | None:
    """query_positions as per-row 1-D arrays (None: the real positions, found when written)."""
    if q is None:
        return None
    if isinstance(q, (list, tuple)):
        return [_np(r).reshape(-1) for r in q]
    return list(_batched(q, 2))


def _blocked_rows(blocked, B: int) -> list | None:
    """blocked keys as per-row (N, 3) (layer, head, position) arrays, from (B, L, H, S) bool or per-row triples."""
    if blocked is None:
        return None
    if isinstance(blocked, (list, tuple)):
        return [None if b is None else _np(b).reshape(-1, 3) for b in blocked]
    blocked = _batched(blocked, 4)
    return [np.argwhere(blocked[b]) for b in range(B)]


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

    columns: tuple[Column, ...] = CORE_COLUMNS  # in file order; a subclass may declare more

    def __init__(self, path: str | os.PathLike, meta: Mapping | None = None, *,
                 received_dtype: str = "float16", decode: Callable[[list[int]], list[str]] | None = None,
                 flush_steps: int = FLUSH_STEPS, flush_seconds: float = FLUSH_SECONDS):
        self.path = os.fspath(path)
        self.received_dtype = received_dtype
        self.decode = decode
        self.meta = dict(meta or {})
        self.meta.update(schema_version=SCHEMA_VERSION, sinklens_version=__version__, units=STORED_UNITS,
                         received_dtype=received_dtype)
        self.num_steps = 0
        self._seen: set[int] = set()  # the token ids whose strings are stored
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
        # the columns a StepEvent carries as fields, and those its request captures (layer first): where
        # their layer axis goes in the file's batch-first cells (the declared place of L; blocked: 1)
        self._event_columns = [c.name for c in self.columns if not from_request(c)]
        self._layer_axis = {c.name: c.layer_axis or 1 for c in self.columns if from_request(c)}

    # ---- metadata -------------------------------------------------------------------------
    def _new_ids(self, tokens: list[np.ndarray] | np.ndarray | Flat) -> list[int]:
        """Token ids of steps' `tokens` (a list of per-step arrays, one (T, ...) array of the steps, or a
        `Flat`) whose strings are not stored yet (decoded when written): by the step that first holds
        them, ascending within a step (a step at a time's order)."""
        if self.decode is None:
            return []
        if type(tokens) is Flat:
            tokens = tokens.steps()
        seen = self._seen
        stacked = type(tokens) is np.ndarray
        if (tokens.size if stacked else sum([t.size for t in tokens])) <= SMALL_IDS:
            # a step at a time in Python sets: a small group's dozen numpy calls cost more (each one
            # the first of its kind in a step of a tiny model: ~15 us)
            new = []
            for step in tokens.reshape(len(tokens), -1).tolist() if stacked else [t.ravel().tolist() for t in tokens]:
                fresh = set(step)
                fresh.difference_update(seen)
                if fresh:
                    fresh = sorted([i for i in fresh if i >= 0])   # no string for a negative id
                    new += fresh
                    seen.update(fresh)
            return new
        if stacked:   # the group's steps stacked: no per-step work
            ids = tokens.reshape(-1)
            starts = np.arange(len(tokens)) * (tokens.size // max(len(tokens), 1))
        else:
            ids = np.concatenate([t.reshape(-1) for t in tokens])
            starts = np.cumsum([0] + [t.size for t in tokens[:-1]])  # where each step's ids begin
        unseen = [i for i in np.unique(ids).tolist() if i >= 0 and i not in seen]   # the distinct ids: a few thousand
        if not unseen:
            return []
        where = np.flatnonzero(np.isin(ids, unseen))                 # the places of the new ids
        unique, first = np.unique(ids[where], return_index=True)    # each new id's first place
        new = unique[np.lexsort((unique, np.searchsorted(starts, where[first], side="right")))].tolist()
        seen.update(new)
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
            self._schema = build_schema(self.meta, self.received_dtype, self._readout_columns(readouts),
                                        self.columns)
        except TypeError as e:
            raise TypeError(f"trace metadata must be JSON-serialisable: {e}") from None
        self._writer = pa.ipc.new_stream(self._sink, self._schema)
        self._sink.flush()  # the schema is on disk before the first group (a run killed now reads as empty)

    # ---- steps ----------------------------------------------------------------------------
    def write_step(self, step: int, tokens, *, maps: Mapping[tuple[int, int], object] | None = None,
                   readouts: Mapping[str, object] | None = None, **columns) -> None:
        """Write one step. Arrays are batch first; a single row may omit the batch axis.

        tokens (B, S) int; columns: the other declared columns by name (`self.columns`; shapes per
        row as declared there): is_masked / revealed / attention_mask (B, S) bool (defaults: all
        False / all False / all True); query_positions (B, S_q) int or a list of per-row 1-D arrays
        (default: the real positions); received (B, L, H, S) float; received_groups (B, G, L, H, S);
        blocked (B, L, H, S) bool or a list of per-row (N, 3) int (layer, head, position) arrays;
        received_unblocked (B, L, H, S): what the keys would have received without the blocking
        (ranking source); learned_sink (B, L, H): the attention the model's learned sink logits took
        (gpt-oss); edited (B, S) bool: unmasked tokens rewritten at this step (LLaDA2.1), None =
        never; commit_prob (B, S) float: the probability of each committed token (NaN elsewhere).
        maps {(layer, head): (B, S_q, S_k)}; readouts {column: (B, ...) array}: mechanism readouts
        (sinklens/trace/readouts.py COLUMNS), each row stored flat in its declared row-major shape.
        """
        if self.closed:
            raise RuntimeError(f"trace {self.path} is closed")
        unknown = sorted(set(columns) - {c.name for c in self.columns})
        if unknown:
            raise TypeError(f"write_step got unknown column(s) {unknown}; the trace's columns: "
                            f"{[c.name for c in self.columns]}")
        tokens = _batched(tokens, 2)
        dims = {"B": tokens.shape[0], "S": tokens.shape[1]}
        if self._writer is not None:  # L and H are the trace's
            dims.update(L=self.meta.get("num_layers"), H=self.meta.get("num_heads"))
        cells = check_step(self.columns, {**columns, "tokens": tokens}, dims)
        B = dims["B"]
        readouts = dict(readouts or {})
        unknown = sorted(set(readouts) - set(COLUMN_NAMES))
        if unknown:
            raise ValueError(f"unknown readout column(s) {unknown}; known: {list(COLUMN_NAMES)}")
        readouts = {name: _np(arr) for name, arr in readouts.items() if arr is not None}
        for name, arr in readouts.items():
            if arr.shape[0] != B:
                raise ValueError(f"readout {name} must be batch first with {B} rows, got shape {arr.shape}")
        if self._writer is None:
            self._start(tokens, (dims["L"], dims["H"]) if "L" in dims and "H" in dims else None, readouts)
        absent = sorted(set(readouts) - set(self._schema.names))
        if absent:
            raise ValueError(f"readout column(s) {absent} were not recorded at the first step, so the trace has no "
                             "column for them: declare their options in the metadata's 'readouts'")
        cells.update(readouts)
        nbytes = sum(a.nbytes for name, a in cells.items()
                     if type(a) is np.ndarray and name not in ("tokens",) and a.dtype != np.bool_)
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

    # ---- hook interface (see sinklens/samplers/steps.py) ----------------------------------
    def after_step(self, event) -> None:
        """Hold a sampler's StepEvent for its group's write (module docstring): all the sampler
        waits for is a copy of the canvas and the request's captures, stacked as it holds them."""
        if self.closed:
            raise RuntimeError(f"trace {self.path} is closed")
        req = event.attention
        cells, maps = {}, None
        fields = vars(event)  # one lookup per column below, no call each (a tiny model's step is ~1 ms)
        fresh = fields["fresh"] if "fresh" in fields else ()
        for name in self._event_columns:  # a field of the event: copied (the sampler changes its canvas in place)
            x = fields[name] if name in fields else None
            if x is not None:
                copy = name not in fresh   # (a fresh field: nothing changes it after the step)
                if type(x) is list:
                    x = [_held(r, copy=copy) for r in x]
                else:
                    x = self._canvas_copy(name, x) if copy else _held(x)
            cells[name] = x
        if req is not None:
            # received is kept beside the groups: where they sum to it (the masked / unmasked split)
            # the group's write leaves it out, for all the group's steps in one test; blocked is a
            # hook's instruction, copied (the hook may reuse it)
            for name in self._layer_axis:
                x = request_capture(req, name)
                cells[name] = x if x is None else _held(x, copy=name == "blocked")
            if req.groups_cover_rows and cells.get("received_groups") is not None:
                cells["received"] = None   # the groups' sum: the reader derives it (schema 2)
        layer_axis = self._layer_axis
        if req is not None:
            maps = {k: _held(m) for k, m in req.maps.items()} if req.maps else None
            names = req.readout_names
            if names:
                layer_axis = {**layer_axis, **dict.fromkeys(names, 1)}
                cells.update((name, _held(req.readout(name))) for name in names)
            if req.lens is not None:  # batch first
                cells.update(lens_positions=_held(req.lens["positions"]), lens_tokens=_held(req.lens["tokens"]),
                             lens_probs=_held(req.lens["probs"]))
        if self._writer is None:
            self._start_from(cells)
        nbytes = sum([x.nbytes for name, x in cells.items() if name in layer_axis and x is not None])
        if maps:
            nbytes += sum([m.nbytes for m in maps.values()])
        self._hold(HeldStep(event.step, cells["tokens"].shape[0], cells, layer_axis, maps), self._due(nbytes))

    def _canvas_copy(self, name: str, x):
        """A held copy of the canvas tensor `x`: the previous step's copy where `x` is the same tensor,
        unchanged since (a sampler passes its padding mask, and often more, step after step)."""
        last = self._canvas[name] if name in self._canvas else None
        if last is not None and last[0] is x and last[1] is not None and x._version == last[1]:  # a tensor: versioned
            return last[2]
        held = _held(x, copy=True)
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
    def _parts(self, steps: list[HeldStep], name: str, flat: bool = True):
        """Column `name` of the group's steps, batch first: one (T, B, ...) array where every step
        holds an array of one shape (one stack and one transpose for the group); where the steps are a
        sampler's tensors of differing shapes (an ARM's growing canvas) and `flat`, one `Flat`; else a
        part per step (a (B, ...) array, a list of per-row arrays, or None)."""
        held = [s.cells[name] if name in s.cells else None for s in steps]
        kinds = {type(x) for x in held}   # one pass (a call per step and column was a tenth of a tiny model's step)
        if kinds == {type(None)}:
            return held
        axes = {s.layer_axis[name] if name in s.layer_axis else None for s in steps}
        if len(axes) == 1 and type(None) not in kinds:
            axis = axes.pop()
            block = None if list in kinds else _stack(held, kinds)  # (T, [L,] B, ...)
            if block is not None:
                return block if axis is None else _batch_first(block, axis, lead=1)
            cells = _flat(held, axis) if flat else None
            if cells is not None:
                return cells
        parts = [None] * len(held)
        for t, (s, x) in enumerate(zip(steps, held)):
            if type(x) is list:
                parts[t] = [_np(r) for r in x]
            elif x is not None:
                axis = s.layer_axis[name] if name in s.layer_axis else None
                parts[t] = _np(x) if axis is None else _batch_first(_np(x), axis)
        return parts

    def flush(self) -> None:
        """Write the steps held in memory (one record batch for the group) and flush the file."""
        if not self._pending:
            return
        steps, self._pending, self._pending_bytes = self._pending, [], 0
        rows = [s.rows for s in steps]
        # blocked stays a part per step (its rows become triples below), and so does received where
        # groups were recorded (`_derive_received` compares the two)
        parts = {"received_groups": self._parts(steps, "received_groups", flat=False)}
        groups = parts["received_groups"]
        per_step = ("blocked",) if type(groups) is list and _all_none(groups) else ("blocked", "received")
        parts.update((name, self._parts(steps, name, flat=name not in per_step)) for name in self._schema.names
                     if name not in ("step", "row", "maps", "received_groups"))
        self._fill_defaults(parts)
        self._derive_received(parts)
        columns = {"query_positions": self._query_column(parts, rows),
                   "step": pa.array(_int32([s.step for s in steps for _ in range(s.rows)])),
                   "row": _row_column(tuple(rows)),
                   "maps": self._maps_column(steps)}
        # a sampler's blocked keys arrive as (B, L, H, S) bool: the file holds (layer, head, position) triples
        parts["blocked"] = [[np.argwhere(row) for row in _rows_of(b)] if type(b) is np.ndarray else b
                            for b in parts["blocked"]]
        for name in self._schema.names:
            if name not in columns:
                columns[name] = _column(parts[name], rows, self._schema.field(name).type.value_type)
        self._write_batch(pa.record_batch([columns[f.name] for f in self._schema], schema=self._schema),
                          parts["tokens"])

    def _fill_defaults(self, parts: dict) -> None:
        """A declared fill (is_masked, revealed: False; attention_mask: True) where a step gave none."""
        tokens = parts["tokens"]
        for c in self.columns:
            if c.fill is not None and type(parts[c.name]) is list:
                parts[c.name] = [np.full(t.shape, c.fill) if p is None else p for p, t in zip(parts[c.name], tokens)]

    @staticmethod
    def _derive_received(parts: dict) -> None:
        """received is left out (null: the reader sums the groups, schema 2) where it is their sum."""
        received, groups = parts["received"], parts["received_groups"]
        if type(groups) is list and _all_none(groups):  # no groups: nothing to derive received from
            return
        if type(received) is np.ndarray and type(groups) is np.ndarray:  # every step holds both: one test
            derivable = _sums_of_groups(received, groups)
        else:
            derivable = [r is not None and g is not None and _is_sum_of(r, g) for r, g in zip(received, groups)]
        if all(derivable):
            parts["received"] = [None] * len(derivable)
        elif any(derivable):
            parts["received"] = [None if d else r for d, r in zip(derivable, received)]

    @staticmethod
    def _query_column(parts: dict, rows: list[int]) -> pa.Array:
        """query_positions, each step's own or its rows' real positions (their attention mask's)."""
        if type(parts["query_positions"]) is Flat:
            return _column(parts["query_positions"], rows, pa.int32())
        if _all_none(parts["query_positions"]):
            return _real_positions(parts["attention_mask"])
        return _column([[np.flatnonzero(r) for r in _rows_of(m)] if q is None else q
                        for q, m in zip(parts["query_positions"], parts["attention_mask"])], rows, pa.int32())

    def _write_batch(self, batch: pa.RecordBatch, tokens) -> None:
        """One record batch for the group (schema 3): Arrow's per-batch cost (buffers and metadata per
        column, the checksum's serialisation) is paid once per group, not once per step. A checksum of
        the batch's serialised bytes lets the reader tell damaged steps from good ones (Arrow itself
        has none); the reader verifies a batch when it first reads a step of it."""
        custom = {CHECKSUM_KEY: str(zlib.crc32(batch.serialize()))}
        vocab = self._vocab(self._new_ids(tokens))  # the group's new ids, one decode
        if vocab:
            custom[VOCAB_KEY] = json.dumps(vocab)
        self._writer.write_batch(batch, custom_metadata=custom)
        self._sink.flush()
        self._flushed_at = time.monotonic()

    def _maps_column(self, steps: list[HeldStep]) -> pa.Array:
        struct_type = self._schema.field("maps").type
        if not any([s.maps for s in steps]):
            return _typed_nulls(sum([s.rows for s in steps]), struct_type)
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
            self._schema = build_schema(self.meta, self.received_dtype, self._readout_columns(()), self.columns)
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
