"""The trace file format: one Arrow IPC stream per run (see docs/design.md, Contract 4).

Why Arrow IPC *stream*: append-only (each denoising step is on disk as soon as it is
written, so an interrupted run keeps its finished steps), readable without sinklens
(`pyarrow.ipc.open_stream`, polars, R arrow, DuckDB), memory-mappable (a reader touches only
the steps and columns it asks for), float16 and nested lists are native types.

Layout: schema metadata key `sinklens` holds a UTF-8 JSON object (run metadata); one row per
(step, batch element), a step's rows consecutive, in record batches of one or more steps (one per
written group; schema 1 and 2: one per step). Each batch may carry custom metadata under
`sinklens.vocab`: a JSON id -> string map of the token ids first seen in its steps, and
carries `sinklens.crc32`: the CRC-32 of the batch's serialised bytes (damage detection).
"""
from __future__ import annotations

import functools

import pyarrow as pa

from sinklens.columns import Column
from sinklens.trace.readouts import COLUMNS

SCHEMA_VERSION = 3
# Version 2 stores `received` as null where it is the sum of `received_groups` (the default
# masked / unmasked split): a third of the bytes. Version 1 always stored it. Version 3 writes one
# record batch per group of steps (a step's rows consecutive) instead of one per step: Arrow's
# per-batch cost was a tenth of a tiny model's step. The reader reads all three.
READABLE_VERSIONS = (1, 2, 3)
META_KEY = b"sinklens"  # schema metadata key (JSON)
VOCAB_KEY = "sinklens.vocab"  # per-batch custom metadata key (JSON id -> string)
CHECKSUM_KEY = "sinklens.crc32"  # per-batch custom metadata: zlib.crc32 of RecordBatch.serialize()
# What `received` holds, under the metadata key `units`: r_j = sum over the summed query rows i of
# A[i, j], the sink rule's STORED_UNITS (sinklens/rule/spec.py, the one home of units: the analysis
# derives every other unit from it). Files from earlier versions say "column_sum" for the same.
RECEIVED_DTYPES = {"float16": pa.float16(), "float32": pa.float32()}

# The 8-byte end-of-stream marker (continuation token 0xFFFFFFFF + zero length) that a
# closed Arrow IPC stream ends with. A file without it was not closed: it is truncated.
EOS_MARKER = b"\xff\xff\xff\xff\x00\x00\x00\x00"
# Every message of the stream (the schema first) starts with the continuation token.
STREAM_START = b"\xff\xff\xff\xff"


def replaceable(path) -> bool:
    """True when a new trace may be written at `path`: nothing there, an empty file, or an Arrow
    stream (an earlier trace, maybe cut short). Any other file is someone's data: never overwritten."""
    try:
        with open(path, "rb") as f:
            return f.read(len(STREAM_START)) in (b"", STREAM_START)
    except FileNotFoundError:
        return True
    except IsADirectoryError:
        return False


class TraceFormatError(ValueError):
    """The file is not a readable sinklens trace (corrupt, foreign, or another schema version)."""


# The core columns, one row per (step, batch row), in file order (after `step` and `row`; `maps`,
# a list of structs, sits after received_unblocked). A column added here is written (`write_step`
# keyword, a StepEvent field or a request capture of its name), read back (`Trace.column`) and
# validated (its shape letters against the step's B / S / L / H) with no other edit.
CORE_COLUMNS: tuple[Column, ...] = (
    Column("tokens", "S", "int32", "canvas fed to the model (ARM: the prefix so far)"),
    Column("is_masked", "S", "bool", "mask state fed to the model", fill=False),
    Column("revealed", "S", "bool", "committed at this step", fill=False),
    Column("attention_mask", "S", "bool", "real (non-pad) positions", fill=True),
    Column("query_positions", "Q", "int32", "absolute positions of the summed query rows (default: the real ones)"),
    Column("received", "LHS", "received", "sum over summed query rows of A[i, j]; null = the sum of received_groups"),
    Column("received_groups", "GLHS", "received", "received per query group (masked / unmasked) or null"),
    Column("blocked", "N3", "int32", "(layer, head, position) triples of the blocked keys, or null"),
    # what the keys would have received had nothing been blocked: the ranking source of sink masking;
    # null when nothing was blocked at this step (it then equals `received`)
    Column("received_unblocked", "LHS", "received", "received without the blocking (masking's ranking source)"),
    # the attention the model's learned sink logits took (gpt-oss), summed over the same query rows as
    # `received`; null when the model has none. Traces written before this column lack it.
    Column("learned_sink", "LH", "float32", "attention taken by the learned sink logits (gpt-oss)"),
    # LLaDA2.1's token editing; null for samplers that never rewrite a token. Absent in older traces.
    Column("edited", "S", "bool", "already-unmasked tokens rewritten at this step"),
    # the paper's §5.2 readout: does masking a sink lower the confidence of what is committed? NaN
    # where nothing was committed; null at a step that commits nothing (ARM, encoders). Absent in older traces.
    Column("commit_prob", "S", "float32", "probability the step's logits gave each token it committed"),
)
VALUE_TYPES = {"int32": pa.int32(), "bool": pa.bool_(), "float32": pa.float32()}
MAPS_AFTER = "received_unblocked"  # the maps column's place among the core columns


def column_field(c: Column, value: pa.DataType) -> pa.Field:
    """The Arrow field of a declared column: a list of its values; its shape letters and meaning in
    the field's metadata, so a reader reshapes a column it has no declaration for."""
    return pa.field(c.name, pa.list_(value if c.dtype == "received" else VALUE_TYPES[c.dtype]),
                    metadata={b"shape": c.shape.encode(), b"meaning": c.meaning.encode()})


def build_schema(meta: dict, received_dtype: str = "float16", readout_columns=None,
                 core: tuple[Column, ...] = CORE_COLUMNS) -> pa.Schema:
    """The Arrow schema of a trace whose run metadata is `meta` (already JSON-serialisable).

    readout_columns: the mechanism-readout columns the run records (names from
    sinklens/trace/readouts.py COLUMNS); None = all of them. core: the core columns (a writer
    subclass may declare more)."""
    import json

    if received_dtype not in RECEIVED_DTYPES:
        raise ValueError(f"received_dtype must be one of {sorted(RECEIVED_DTYPES)}, got {received_dtype!r}")
    fields = _fields(received_dtype, None if readout_columns is None else tuple(readout_columns), tuple(core))
    return pa.schema(fields, metadata={META_KEY: json.dumps(meta, sort_keys=True).encode("utf-8")})


@functools.lru_cache(maxsize=64)
def _fields(received_dtype: str, readout_columns: tuple[str, ...] | None,
            core: tuple[Column, ...]) -> tuple[pa.Field, ...]:
    """`build_schema`'s fields, made once per process for each set of columns (a trace per generation
    of a tiny model made them anew each time: a tenth of the file's cost)."""
    value = RECEIVED_DTYPES[received_dtype]
    map_struct = pa.struct([("layer", pa.int32()), ("head", pa.int32()), ("values", pa.list_(pa.float32()))])
    fields = [pa.field("step", pa.int32(), nullable=False), pa.field("row", pa.int32(), nullable=False)]
    for c in core:
        fields.append(column_field(c, value))
        if c.name == MAPS_AFTER:  # full (S_q, S_k) maps of requested slices or null
            fields.append(pa.field("maps", pa.list_(map_struct)))
    # Mechanism readouts (sinklens/trace/readouts.py): optional columns, only those the run records
    # (each column of a batch costs the writer and the file a few buffers, recorded or not); absent
    # ones, as in older traces, read as None.
    fields += [column_field(c, value) for cols in COLUMNS.values() for c in cols
               if readout_columns is None or c.name in readout_columns]
    return tuple(fields)
