"""Column building for the trace writer: a step's arrays and tensors as numpy, and a group of
steps' cells as Arrow list columns (one stack and one cast per column where the steps agree in
shape). No trace semantics here: which columns exist and what they hold is trace/schema.py's.
"""
from __future__ import annotations

import functools
import itertools
import sys
from typing import NamedTuple

import numpy as np
import pyarrow as pa


def _np(x) -> np.ndarray | None:
    """A numpy view of a tensor / array / list (None passes through)."""
    if x is None or type(x) is np.ndarray:
        return x
    torch = sys.modules.get("torch")   # a tensor: torch is loaded (this module never imports it)
    if torch is not None and isinstance(x, torch.Tensor):
        if x.is_cpu and not x.requires_grad and x.dtype is not torch.bfloat16:
            return x.numpy()
        x = x.detach().to("cpu")
        if x.dtype is torch.bfloat16:
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
    torch = sys.modules.get("torch")
    if x is None or torch is None or not isinstance(x, torch.Tensor):
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


def _stack(xs: list, kinds: set[type] | None = None) -> np.ndarray | None:
    """One (T, ...) numpy array of T arrays or tensors of one shape (None where the shapes differ): a
    sampler's tensors in one torch.stack and one conversion (torch is loaded where there are tensors).
    kinds: the types of `xs`, where the caller has them."""
    torch = sys.modules.get("torch")
    kinds = {type(x) for x in xs} if kinds is None else kinds
    if torch is not None and all([issubclass(k, torch.Tensor) for k in kinds]):
        return _np(torch.stack(xs)) if len({x.shape for x in xs}) == 1 else None
    arrays = [_np(x) for x in xs]
    return np.stack(arrays) if len({a.shape for a in arrays}) == 1 else None


class Flat(NamedTuple):
    """A group's column whose steps differ in shape (an ARM's canvas grows a position a step), made from
    the sampler's CPU tensors: every (step, row) cell flat row-major, one after another, in one tensor."""

    values: object       # (N,) torch tensor: the cells one after another
    sizes: list[int]     # each cell's length, in (step, row) order
    rows: list[int]      # each step's cells (B; query_positions: its rows)

    def steps(self) -> list[np.ndarray]:
        """Each step's values (numpy views): the token ids of each step, for the vocabulary."""
        return self._split(self.values.numpy(), [sum(self.sizes[c - b:c]) for b, c in
                                                 zip(self.rows, itertools.accumulate(self.rows))])

    def cells(self) -> list[np.ndarray]:
        """Each (step, row) cell's values (numpy views)."""
        return self._split(self.values.numpy(), self.sizes)

    @staticmethod
    def _split(values: np.ndarray, lengths: list[int]) -> list[np.ndarray]:
        ends = list(itertools.accumulate(lengths))
        return [values[e - n:e] for n, e in zip(lengths, ends)]


def _flat(held: list, axis: int | None) -> Flat | None:
    """The steps' cells of one column as a `Flat`, through torch alone (None where a step holds anything
    but CPU tensors of the first one's dtype). held: per step a tensor batch first, or layer first with
    its layer axis going `axis` places on (`_batch_first`), or a list of per-row 1-D tensors
    (query_positions). Why torch: inside a generation the torch ops the sampler and the model run every
    step are in the caches, while a numpy or pyarrow routine is the first of its kind since the forward
    (in place on the tiny twins a cumsum took 170 µs, then 7 µs): the same join in numpy gained a traced
    tiny ARM nothing, this one 0.98× (docs/design.md, the seventh pass)."""
    torch = sys.modules.get("torch")
    if torch is None or not held:
        return None
    first = held[0][0] if type(held[0]) is list and held[0] else held[0]
    dtype = getattr(first, "dtype", None)
    if dtype is None or dtype is torch.bfloat16:
        return None
    flat, sizes, rows = [], [], []
    for x in held:
        cells = x if type(x) is list else [x.movedim(0, axis) if axis else x]
        for c in cells:
            if type(c) is not torch.Tensor or c.dtype is not dtype or not c.is_cpu or c.requires_grad:
                return None
            flat.append(c.reshape(-1))
        if type(x) is list:
            sizes += [c.numel() for c in cells]
            rows.append(len(cells))
        else:
            b = cells[0].shape[0]
            sizes += [cells[0].numel() // b] * b if b else []
            rows.append(b)
    return Flat(torch.cat(flat), sizes, rows)


def _int32(values: list[int]) -> np.ndarray:
    """values as an int32 array: through torch where a sampler loaded it (`_flat`: warm inside a generation)."""
    torch = sys.modules.get("torch")
    return np.array(values, dtype=np.int32) if torch is None else torch.tensor(values, dtype=torch.int32).numpy()


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


def _rows_of(a) -> list:
    """The rows of an array (views) or the items of a list, as a list. Not `list(a)`: iterating an
    array ends on an IndexError whose message numpy formats (~0.7 µs a row list)."""
    return a if type(a) is list else [a[i] for i in range(len(a))]


def _all_none(xs: list) -> bool:
    """Whether every item of `xs` is None (one list pass: a generator costs a call per item)."""
    return all([x is None for x in xs])


def _list_column(rows: list[np.ndarray | None], value_type: pa.DataType) -> pa.Array:
    """A list<value_type> column from one flat numpy array per row (None = null row)."""
    nulls = [r is None for r in rows]
    if all(nulls):
        return pa.nulls(len(rows), pa.list_(value_type))
    lengths = [0 if r is None else r.size for r in rows]
    offsets = np.zeros(len(rows) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    flat = [r if r.ndim == 1 else r.reshape(-1) for r in rows if r is not None]
    values = np.concatenate(flat) if flat else np.zeros(0)
    values = _as(values, _NUMPY[value_type])
    mask = pa.array(nulls) if True in nulls else None
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values, type=value_type), mask=mask)


_NUMPY = {pa.float16(): np.float16, pa.float32(): np.float32, pa.int32(): np.int32, pa.bool_(): np.bool_}
_TORCH = {pa.float16(): "float16", pa.float32(): "float32", pa.int32(): "int32", pa.bool_(): "bool"}  # torch dtypes by name


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


# A group's columns of one shape share their Arrow offsets, null columns and, where every position is
# real, the query rows: made once per shape for the process (Arrow arrays are immutable), where each
# group made its own: 0.4 % of a traced tiny-dlm step (paired in one process, 400 rounds), where each
# pyarrow call is the first of its kind since the last group.
@functools.lru_cache(maxsize=64)
def _even_offsets(cells: int, width: int) -> pa.Array:
    """The offsets of `cells` list cells of `width` values each."""
    return pa.array(np.arange(cells + 1, dtype=np.int32) * width)


@functools.lru_cache(maxsize=64)
def _nulls(cells: int, value_type: pa.DataType) -> pa.Array:
    """A column of `cells` null list<value_type> cells."""
    return _typed_nulls(cells, pa.list_(value_type))


@functools.lru_cache(maxsize=64)
def _typed_nulls(cells: int, arrow_type: pa.DataType) -> pa.Array:
    """A column of `cells` null cells of `arrow_type`."""
    return pa.nulls(cells, arrow_type)


@functools.lru_cache(maxsize=64)
def _row_column(rows: tuple[int, ...]) -> pa.Array:
    """The `row` column of a group whose steps have these batch sizes (made once per group shape)."""
    return pa.array(np.concatenate([np.arange(b, dtype=np.int32) for b in rows]))


@functools.lru_cache(maxsize=64)
def _every_position(cells: int, width: int) -> pa.Array:
    """query_positions of `cells` rows whose `width` positions are all real: 0 .. width - 1 each."""
    return pa.ListArray.from_arrays(_even_offsets(cells, width),
                                    pa.array(np.tile(np.arange(width, dtype=np.int32), cells)))


def _column(parts, rows: list[int], value_type: pa.DataType) -> pa.Array:
    """A list<value_type> column of a group, one cell per (step, row). parts: one (T, B, ...) array
    (a diffusion run's steps have one shape: one cast for the group), or per step a (B, ...) array
    (a cell per row, flat row-major), a list of its rows (None: a null cell) or None (null cells), or a
    `Flat` (steps of differing shapes, one tensor: converted in torch, the same bits as `_as`)."""
    if type(parts) is Flat:
        torch = sys.modules["torch"]
        values = parts.values.to(getattr(torch, _TORCH[value_type])).numpy()
        offsets = _int32([0, *itertools.accumulate(parts.sizes)])
        return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values, type=value_type))
    if type(parts) is np.ndarray:
        values = parts.reshape(-1)
        cells = sum(rows)
        return pa.ListArray.from_arrays(_even_offsets(cells, values.size // cells),
                                        pa.array(_as(values, _NUMPY[value_type]), type=value_type))
    if _all_none(parts):
        return _nulls(sum(rows), value_type)
    cells = [cell for p, b in zip(parts, rows) for cell in ([None] * b if p is None else _rows_of(p))]  # (step, row)
    return _list_column(cells, value_type)


def _real_positions(masks) -> pa.Array:
    """The query_positions column where no step names them: each row's real positions (its
    attention mask's). masks: (T, B, S) in one pass, a `Flat`, or per step (B, S)."""
    if type(masks) is Flat:
        return _list_column([np.flatnonzero(cell) for cell in masks.cells()], pa.int32())
    if type(masks) is not np.ndarray:
        return _list_column([np.flatnonzero(row) for m in masks for row in _rows_of(m)], pa.int32())
    real = masks.reshape(-1, masks.shape[-1])  # (T * B, S)
    if real.all():
        return _every_position(*real.shape)
    row, position = np.nonzero(real)
    offsets = np.zeros(len(real) + 1, dtype=np.int32)
    np.cumsum(np.bincount(row, minlength=len(real)), out=offsets[1:])
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(position.astype(np.int32), type=pa.int32()))
