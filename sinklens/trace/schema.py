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

import pyarrow as pa

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
UNITS = "column_sum"  # received[j] = sum over real query rows i of A[i, j]
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


def build_schema(meta: dict, received_dtype: str = "float16", readout_columns=None) -> pa.Schema:
    """The Arrow schema of a trace whose run metadata is `meta` (already JSON-serialisable).

    readout_columns: the mechanism-readout columns the run records (names from
    sinklens/trace/readouts.py COLUMNS); None = all of them."""
    import json

    if received_dtype not in RECEIVED_DTYPES:
        raise ValueError(f"received_dtype must be one of {sorted(RECEIVED_DTYPES)}, got {received_dtype!r}")
    value = RECEIVED_DTYPES[received_dtype]
    map_struct = pa.struct([("layer", pa.int32()), ("head", pa.int32()), ("values", pa.list_(pa.float32()))])
    fields = [
        pa.field("step", pa.int32(), nullable=False),
        pa.field("row", pa.int32(), nullable=False),
        pa.field("tokens", pa.list_(pa.int32())),  # (S,) canvas fed to the model (ARM: the prefix so far)
        pa.field("is_masked", pa.list_(pa.bool_())),  # (S,) mask state fed to the model
        pa.field("revealed", pa.list_(pa.bool_())),  # (S,) committed at this step
        pa.field("attention_mask", pa.list_(pa.bool_())),  # (S,) real (non-pad) positions
        pa.field("query_positions", pa.list_(pa.int32())),  # absolute positions of the summed query rows
        pa.field("received", pa.list_(value)),  # (L*H*S,) row-major (L, H, S); null = sum of received_groups
        pa.field("received_groups", pa.list_(value)),  # (G*L*H*S,) row-major (G, L, H, S) or null
        pa.field("blocked", pa.list_(pa.int32())),  # flattened (layer, head, position) triples or null
        # (L*H*S,) what the keys would have received had nothing been blocked: the ranking source of
        # sink masking. Null when nothing was blocked at this step (it then equals `received`).
        pa.field("received_unblocked", pa.list_(value)),
        pa.field("maps", pa.list_(map_struct)),  # full (S_q, S_k) maps of requested slices or null
        # (L*H,) row-major (L, H): the attention the model's learned sink logits took (gpt-oss), summed
        # over the same query rows as `received`; null when the model has none. Traces written before
        # this column lack it and read as before (the version is unchanged: a reader that does not
        # know the column never looks it up by name).
        pa.field("learned_sink", pa.list_(pa.float32())),
        # (S,) already-unmasked tokens rewritten at this step (LLaDA2.1's token editing); null for
        # samplers that never rewrite a token. Absent in older traces (read as null).
        pa.field("edited", pa.list_(pa.bool_())),
    ]
    # Mechanism readouts (sinklens/trace/readouts.py): optional columns, only those the run records
    # (each column of a batch costs the writer and the file a few buffers, recorded or not); absent
    # ones, as in older traces, read as None.
    types = {"received": value, "float32": pa.float32(), "int32": pa.int32()}
    fields += [pa.field(c.name, pa.list_(types[c.dtype])) for cols in COLUMNS.values() for c in cols
               if readout_columns is None or c.name in readout_columns]
    return pa.schema(fields, metadata={META_KEY: json.dumps(meta, sort_keys=True).encode("utf-8")})
