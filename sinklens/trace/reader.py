"""Read a trace lazily: the file is memory-mapped and each record batch (a group of steps) is a
zero-copy view, so asking for one step's received attention touches only that step's bytes.

    t = sinklens.open_trace("run.arrow")
    t.received(step=5)            # (L, H, S) float32
    t.learned_sink(step=5)        # (L, H) float32, or None (models without learned sink logits)
    t.truncated                   # True when the run did not close the file (interrupted)

Plain pyarrow reads the same file: `pyarrow.ipc.open_stream(path).read_all()` (docs/samplers.md).
"""
from __future__ import annotations

import json
import mmap
import os
import zlib

import numpy as np
import pyarrow as pa

from sinklens.trace.readouts import COLUMNS
from sinklens.trace.schema import (CHECKSUM_KEY, CORE_COLUMNS, EOS_MARKER, META_KEY, READABLE_VERSIONS, VOCAB_KEY,
                                   TraceFormatError)


READOUT_SHAPES = {c.name: c.shape for cols in COLUMNS.values() for c in cols}
# declared shapes, for traces whose fields do not carry them (written before the fields' metadata)
DECLARED = {**{c.name: c for c in CORE_COLUMNS}, **{c.name: c for cols in COLUMNS.values() for c in cols}}

# Fixed-width arrow types -> numpy, for `as_numpy`
_NUMPY = {pa.int8(): np.int8, pa.int16(): np.int16, pa.int32(): np.int32, pa.int64(): np.int64,
          pa.uint8(): np.uint8, pa.uint16(): np.uint16, pa.uint32(): np.uint32, pa.uint64(): np.uint64,
          pa.float16(): np.float16, pa.float32(): np.float32, pa.float64(): np.float64}


def as_numpy(arr: pa.Array) -> np.ndarray:
    """A null-free fixed-width or boolean arrow array as numpy, read from its buffers (numbers: a
    zero-copy, read-only view). pyarrow's own `to_numpy` imports pandas whenever it is installed: ~45 MB
    and 0.4 s, a quarter of what `sinklens report` costs on a small trace, for nothing it uses."""
    if arr.null_count:
        return arr.to_numpy(zero_copy_only=False)
    buf = arr.buffers()[1]
    if pa.types.is_boolean(arr.type):   # bit-packed, least significant bit first
        bits = np.unpackbits(np.frombuffer(buf, np.uint8), bitorder="little")
        return bits[arr.offset:arr.offset + len(arr)].astype(bool)
    dtype = _NUMPY.get(arr.type)
    if dtype is None:
        return arr.to_numpy(zero_copy_only=False)
    return np.frombuffer(buf, dtype, count=len(arr), offset=arr.offset * np.dtype(dtype).itemsize)


def _file_ends_with_eos(path: str) -> bool:
    size = os.path.getsize(path)
    if size < len(EOS_MARKER):
        return False
    with open(path, "rb") as f:
        f.seek(size - len(EOS_MARKER))
        return f.read() == EOS_MARKER


class Trace:
    """One run's trace. Steps are addressed by their global step number (the `step` column)."""

    def __init__(self, path: str | os.PathLike):
        self.path = os.fspath(path)
        if not os.path.exists(self.path):
            raise FileNotFoundError(f"no trace file at {self.path}")
        if os.path.getsize(self.path) == 0:
            raise TraceFormatError(f"{self.path} is empty (0 bytes): the run writing it stopped before its first "
                                   "step was written")
        closed_properly = _file_ends_with_eos(self.path)
        try:
            # Python's mmap (not pyarrow's) so that pages already read can be given back: see release_pages
            with open(self.path, "rb") as f:
                self._mmap = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            reader = pa.ipc.open_stream(pa.BufferReader(pa.py_buffer(self._mmap)))
        except (pa.ArrowInvalid, pa.ArrowIOError, OSError, ValueError) as e:  # ValueError: an empty file
            if getattr(self, "_mmap", b"")[:1] == b"{":   # a corpus run's JSON lines, not a trace
                raise TraceFormatError(f"{self.path} holds JSON lines (a corpus run's corpus.jsonl?), not a trace: "
                                       "read it with sinklens.analysis.corpus.open_corpus, or `sinklens report "
                                       f"{self.path}`") from None
            raise TraceFormatError(f"{self.path} is not an Arrow IPC stream (corrupt or not a trace): {e}") from None
        raw = (reader.schema.metadata or {}).get(META_KEY)
        if raw is None:
            raise TraceFormatError(f"{self.path} is an Arrow stream but not a sinklens trace "
                                   f"(no '{META_KEY.decode()}' schema metadata)")
        try:
            self.meta: dict = json.loads(raw.decode("utf-8"))
        except ValueError as e:
            raise TraceFormatError(f"{self.path}: the sinklens metadata is not valid JSON: {e}") from None
        version = self.meta.get("schema_version")
        if version not in READABLE_VERSIONS:
            readable = ", ".join(map(str, READABLE_VERSIONS[:-1])) + f" or {READABLE_VERSIONS[-1]}"
            raise TraceFormatError(f"{self.path} has trace schema_version {version!r}; this sinklens "
                                   f"(reads schema_version {readable}) cannot read it")
        self.schema = reader.schema
        self._batches: list[pa.RecordBatch] = []
        self._checksums: list[int | None] = []
        self._verified: set[int] = set()
        vocab = dict(self.meta.get("tokens_vocab") or {})
        error = None
        while True:
            try:
                batch, custom = reader.read_next_batch_with_custom_metadata()
            except StopIteration:
                break
            except (pa.ArrowInvalid, pa.ArrowIOError, OSError) as e:
                error = e
                break
            self._batches.append(batch)
            crc = None if custom is None else custom.get(CHECKSUM_KEY.encode())
            self._checksums.append(None if crc is None else int(crc))
            if custom is not None and VOCAB_KEY.encode() in custom:
                vocab.update(json.loads(custom[VOCAB_KEY.encode()].decode("utf-8")))
        if error is not None and closed_properly:
            # The stream ends with its marker yet a step cannot be read: damaged, not cut short.
            raise TraceFormatError(f"{self.path} is corrupt: step {len(self._batches)} cannot be read ({error})")
        self.truncated = error is not None or not closed_properly
        self.meta["tokens_vocab"] = vocab
        self._index: dict[int, tuple[int, int, int]] = {}  # step -> (batch, its first row there, its rows)
        for i, b in enumerate(self._batches):
            steps = as_numpy(b.column("step"))  # a step's rows are consecutive (one step per batch before schema 3)
            starts = np.flatnonzero(np.r_[True, steps[1:] != steps[:-1]]) if len(steps) else []
            for first, end in zip(starts, [*starts[1:], len(steps)]):
                self._index[int(steps[first])] = (i, int(first), int(end - first))

    # ---- shape ---------------------------------------------------------------------------
    @property
    def steps(self) -> list[int]:
        return sorted(self._index)

    @property
    def num_steps(self) -> int:
        return len(self._index)

    @property
    def num_layers(self) -> int:
        return int(self.meta.get("num_layers") or 0)

    @property
    def num_heads(self) -> int:
        return int(self.meta.get("num_heads") or 0)

    @property
    def seq_len(self) -> int:
        return int(self.meta.get("seq_len") or 0)

    @property
    def batch_size(self) -> int:
        return int(self.meta.get("batch_size") or 0)

    def __len__(self) -> int:
        return self.num_steps

    def __repr__(self) -> str:
        return (f"Trace({self.path!r}, steps={self.num_steps}, layers={self.num_layers}, heads={self.num_heads}, "
                f"batch={self.batch_size}, seq_len={self.seq_len}{', truncated' if self.truncated else ''})")

    # ---- raw access ------------------------------------------------------------------------
    def _batch(self, i: int) -> pa.RecordBatch:
        """Batch i, its checksum verified the first time it is read (lazily: one step's bytes)."""
        batch = self._batches[i]
        if i not in self._verified:
            want = self._checksums[i]
            if want is not None and zlib.crc32(batch.serialize()) != want:
                steps = batch.column("step")
                raise TraceFormatError(f"{self.path} is corrupt: the record batch of steps {steps[0].as_py()}-"
                                       f"{steps[-1].as_py()} fails its CRC-32 check")
            self._verified.add(i)
        return batch

    def release_pages(self) -> None:
        """Give back the resident memory of the file pages read so far.

        The file is memory-mapped: every step read stays in this process's RSS until the OS
        needs the memory, so a pass over all steps would hold the whole file. The views handed
        out stay valid (dropped pages are read again from the page cache on access); a
        step-by-step reader (sinklens.analysis) calls this after each step.
        """
        if hasattr(mmap, "MADV_DONTNEED") and not self._mmap.closed:
            self._mmap.madvise(mmap.MADV_DONTNEED)

    def verify(self) -> None:
        """Check every step's checksum now (reads the whole file); raises TraceFormatError."""
        for i in range(len(self._batches)):
            self._batch(i)

    def _cell(self, column: str, step: int, row: int) -> np.ndarray | None:
        """Zero-copy numpy view of one list cell (None when null)."""
        if not isinstance(step, (int, np.integer)) or isinstance(step, bool):
            raise TypeError(f"step must be an int, one of this trace's step numbers (t.steps), got {step!r}")
        if step not in self._index:
            raise KeyError(f"step {step} is not in this trace (steps {self.steps[:3]}...{self.steps[-3:]})"
                           if self._index else f"step {step}: this trace has no steps")
        i, first, rows = self._index[step]
        if not 0 <= row < rows:
            raise IndexError(f"row {row} out of range: the trace has batch size {rows}")
        col = self._batch(i).column(column)
        r = first + row
        if col.null_count and not col[r].is_valid:
            return None
        start, end = col.offsets[r].as_py(), col.offsets[r + 1].as_py()
        values = col.values.slice(start, end - start)
        if pa.types.is_struct(values.type):
            return values
        return as_numpy(values)

    def tokens(self, step: int, row: int = 0) -> np.ndarray:
        """(S,) int32 canvas fed to the model at `step`."""
        return self._cell("tokens", step, row)

    def is_masked(self, step: int, row: int = 0) -> np.ndarray:
        """(S,) bool mask state fed to the model."""
        return self._cell("is_masked", step, row)

    def revealed(self, step: int, row: int = 0) -> np.ndarray:
        """(S,) bool positions committed at `step`."""
        return self._cell("revealed", step, row)

    def attention_mask(self, step: int, row: int = 0) -> np.ndarray:
        """(S,) bool real (non-pad) positions."""
        return self._cell("attention_mask", step, row)

    def query_positions(self, step: int, row: int = 0) -> np.ndarray:
        """Absolute positions of the query rows whose attention was summed."""
        return self._cell("query_positions", step, row)

    def blocked(self, step: int, row: int = 0) -> np.ndarray:
        """(N, 3) int (layer, head, position) keys blocked at `step` (empty when none)."""
        cell = self._cell("blocked", step, row)
        return np.zeros((0, 3), np.int32) if cell is None else cell.reshape(-1, 3)

    def received(self, step: int, row: int = 0) -> np.ndarray:
        """(L, H, S) float32 received attention r_j (column sums) at `step`."""
        cell = self._cell("received", step, row)
        if cell is None:
            groups = self.received_groups(step, row)  # schema 2: received = the sum of the groups
            if groups is None:
                raise KeyError(f"step {step} has no received attention stored")
            return groups.sum(axis=0)
        return cell.astype(np.float32).reshape(self.num_layers, self.num_heads, -1)

    def received_unblocked(self, step: int, row: int = 0) -> np.ndarray:
        """(L, H, S) float32: what the keys would have received at `step` had nothing been blocked
        (the ranking source of sink masking); `received(step)` where nothing was blocked."""
        cell = None
        if "received_unblocked" in self.schema.names:  # traces written before it existed lack it
            cell = self._cell("received_unblocked", step, row)
        if cell is None:
            return self.received(step, row)
        return cell.astype(np.float32).reshape(self.num_layers, self.num_heads, -1)

    def edited(self, step: int, row: int = 0) -> np.ndarray | None:
        """(S,) bool already-unmasked tokens rewritten at `step` (LLaDA2.1's editing); None when the
        sampler never rewrites tokens (or the trace predates the column)."""
        if "edited" not in self.schema.names:
            return None
        return self._cell("edited", step, row)

    def commit_prob(self, step: int, row: int = 0) -> np.ndarray | None:
        """(S,) float32: the probability the step's logits gave each token it committed (NaN where it
        committed none; the paper's §5.2 readout); None at a step that commits nothing (or an older trace)."""
        return self.column("commit_prob", step, row)

    def learned_sink(self, step: int, row: int = 0) -> np.ndarray | None:
        """(L, H) float32 attention the model's learned sink logits took at `step` (gpt-oss), summed
        over the same query rows as `received`; None when the model has none (or the trace predates
        the column)."""
        if "learned_sink" not in self.schema.names:
            return None
        cell = self._cell("learned_sink", step, row)
        return None if cell is None else cell.astype(np.float32).reshape(self.num_layers, self.num_heads)

    def readout(self, name: str, step: int, row: int = 0) -> np.ndarray | None:
        """A mechanism readout (sinklens/trace/readouts.py COLUMNS) at `step`, in its declared shape:
        value_norm, key_norm, qk_cos, distance (L, H, S); query_norm, diagonal (L, H); hidden_norm
        (L, S_q); hidden_top_channels / hidden_top_values (L, S_q, k); lens_positions (P,);
        lens_tokens / lens_probs (N, P, k), N = len(meta["readouts"]["lens_layers"]).
        None where the run did not record it (or the trace predates the column)."""
        if name not in READOUT_SHAPES:
            raise KeyError(f"unknown readout {name!r}; readouts: {sorted(READOUT_SHAPES)}")
        return self.column(name, step, row)

    def column(self, name: str, step: int, row: int = 0) -> np.ndarray | None:
        """Any column at `step` in its declared shape (the shape letters its field carries, else the
        declarations of sinklens/columns.py and trace/schema.py; sinklens/columns.py says what each
        letter is); values that were stored in the received dtype as float32. None where the cell is
        null or the trace has no such column (a run that did not record it, an older trace)."""
        if name not in self.schema.names:
            return None
        cell = self._cell(name, step, row)
        if cell is None:
            return None
        f = self.schema.field(name)
        declared = DECLARED.get(name)
        shape = (f.metadata or {}).get(b"shape", b"").decode() or (declared.shape if declared else "")
        if pa.types.is_floating(f.type.value_type) and f.type.value_type.bit_width == 16:
            cell = cell.astype(np.float32)
        if not shape:
            return cell
        sizes = [self._letter(a, step, row) for a in shape]
        return cell.reshape([-1 if n is None else n for n in sizes])

    def _letter(self, letter: str, step: int, row: int) -> int | None:
        """The length of shape letter `letter` at `step` (None: the one the cell's size decides)."""
        if letter == "S":
            return len(self._cell("tokens", step, row))
        if letter in "LH":
            return self.num_layers if letter == "L" else self.num_heads
        if letter == "3":
            return 3
        if letter == "Q" and "hidden_norm" in self.schema.names:  # the hidden readouts' rows
            return len(self._cell("hidden_norm", step, row)) // self.num_layers
        if letter == "N":  # lens layers
            return len((self.meta.get("readouts") or {}).get("lens_layers") or []) or 1
        if letter == "P" and "lens_positions" in self.schema.names:
            return len(self._cell("lens_positions", step, row))
        return None

    def readouts(self, step: int, row: int = 0) -> dict[str, np.ndarray]:
        """Every readout recorded at `step`: {column: array} (see `readout`)."""
        out = {name: self.readout(name, step, row) for name in READOUT_SHAPES}
        return {k: v for k, v in out.items() if v is not None}

    def received_groups(self, step: int, row: int = 0) -> np.ndarray | None:
        """(G, L, H, S) float32 received attention per query group (meta['query_groups']), or None."""
        cell = self._cell("received_groups", step, row)
        if cell is None:
            return None
        return cell.astype(np.float32).reshape(-1, self.num_layers, self.num_heads, len(self.tokens(step, row)))

    def received_all(self, row: int = 0, layers=None, heads=None, fill: float = np.nan) -> np.ndarray:
        """(T, L', H', S) float32 over all steps; optional layer / head selections.

        Steps with a shorter sequence (ARM decoding grows the prefix) are padded with `fill`
        (NaN by default: the key did not exist yet) up to the longest step.
        """
        steps = self.steps
        per_step = [self.received(s, row) for s in steps]
        S = max((r.shape[-1] for r in per_step), default=self.seq_len)
        L = self.num_layers if layers is None else len(np.atleast_1d(layers))
        H = self.num_heads if heads is None else len(np.atleast_1d(heads))
        out = np.full((len(steps), L, H, S), fill, dtype=np.float32)
        for t, r in enumerate(per_step):
            if layers is not None:
                r = r[np.atleast_1d(layers)]
            if heads is not None:
                r = r[:, np.atleast_1d(heads)]
            out[t, :, :, : r.shape[-1]] = r
        return out

    def map(self, step: int, layer: int, head: int, row: int = 0) -> np.ndarray:
        """(S_q, S_k) float32 full attention map of a requested (layer, head) slice."""
        cell = self._cell("maps", step, row)
        available = [] if cell is None else [(m["layer"], m["head"]) for m in cell.to_pylist()]
        if cell is not None:
            for m in cell.to_pylist():
                if m["layer"] == layer and m["head"] == head:
                    s_k = len(self.tokens(step, row))
                    return np.asarray(m["values"], dtype=np.float32).reshape(-1, s_k)
        raise KeyError(f"no map for (layer {layer}, head {head}) at step {step}; stored slices: {available}")

    def decode(self, ids) -> list[str]:
        """Token strings from the trace's own vocabulary map (meta tokens_vocab)."""
        vocab = self.meta.get("tokens_vocab") or {}
        return [vocab.get(str(int(i)), f"<{int(i)}>") for i in np.atleast_1d(ids)]

    def table(self) -> pa.Table:
        """All complete steps as one Arrow table (zero-copy)."""
        self.verify()
        return pa.Table.from_batches(self._batches, schema=self.schema)

    def close(self) -> None:
        self._batches = []
        self._index = {}
        try:
            self._mmap.close()
        except BufferError:  # arrays handed out still view the map: it closes when they are gone
            pass

    def __enter__(self) -> "Trace":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def open_trace(path: str | os.PathLike) -> Trace:
    """Open a trace file lazily (memory-mapped). Raises TraceFormatError on a foreign, corrupt or
    other-version file; a file cut short loads its complete steps with `truncated = True`."""
    return Trace(path)
