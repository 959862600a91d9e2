"""Read JSON Lines data files: a malformed line is reported with its number, the rest still loads."""
from __future__ import annotations

import gzip
import json
import os
import warnings
from dataclasses import dataclass


@dataclass
class JsonlError:
    path: str
    line: int           # 1-based line number
    message: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.message}"


def read_jsonl(path: str, required: tuple[str, ...] = ()) -> tuple[list[dict], list[JsonlError]]:
    """Records (each with `_line`, its 1-based line number) and the lines that could not be used."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"data file not found: {path!r} (expected a JSON Lines file, one object per line)")
    opener = gzip.open if path.endswith(".gz") else open
    records, errors = [], []
    with opener(path, "rt", encoding="utf-8") as f:
        for n, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                errors.append(JsonlError(path, n, f"not valid JSON ({e.msg} at column {e.colno})"))
                continue
            if not isinstance(rec, dict):
                errors.append(JsonlError(path, n, f"expected a JSON object, got {type(rec).__name__}"))
                continue
            missing = [k for k in required if k not in rec]
            if missing:
                errors.append(JsonlError(path, n, f"missing field(s) {missing}"))
                continue
            rec["_line"] = n
            records.append(rec)
    for e in errors:
        warnings.warn(f"skipping malformed line {e}", stacklevel=2)
    return records, errors
