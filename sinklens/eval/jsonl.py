"""Read JSON Lines data files: a bad line is skipped and reported as file:line, the rest still loads.

A line is bad when it is not UTF-8, not JSON, not an object, lacks a required field, has a
required field that is not a string (`"answer": null`), or fails the caller's own `check`.
A UTF-8 byte-order mark at the start of the file is not part of line 1 (editors on Windows write one).
The caller decides how to report the errors (the eval runner prints them once and keeps them
in config.json).
"""
from __future__ import annotations

import gzip
import json
import os
from dataclasses import dataclass
from typing import Callable

_BOM = b"\xef\xbb\xbf"


@dataclass
class JsonlError:
    path: str
    line: int           # 1-based line number
    message: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.message}"


def _decode(raw: bytes) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"not valid UTF-8 (byte 0x{raw[e.start]:02x} at column {e.start + 1})") from None


def _parse(raw: bytes, required: tuple[str, ...], check: Callable[[dict], str | None] | None) -> dict:
    """One line -> its record, or ValueError saying what is wrong with it."""
    try:
        rec = json.loads(_decode(raw))
    except json.JSONDecodeError as e:
        raise ValueError(f"not valid JSON ({e.msg} at column {e.colno})") from None
    if not isinstance(rec, dict):
        raise ValueError(f"expected a JSON object, got {type(rec).__name__}")
    missing = [k for k in required if k not in rec]
    if missing:
        raise ValueError(f"missing field(s) {missing}")
    not_text = {k: type(rec[k]).__name__ for k in required if not isinstance(rec[k], str)}
    if not_text:
        raise ValueError("field(s) must be strings: " + ", ".join(f"{k} is {t}" for k, t in not_text.items()))
    problem = check(rec) if check is not None else None
    if problem:
        raise ValueError(problem)
    return rec


def read_jsonl(path: str, required: tuple[str, ...] = (),
               check: Callable[[dict], str | None] | None = None) -> tuple[list[dict], list[JsonlError]]:
    """Records (each with `_line`, its 1-based line number) and the lines that could not be used.

    required: fields every record must have, as strings; check(record) -> None, or what is wrong.
    """
    if not os.path.isfile(path):
        raise FileNotFoundError(f"data file not found: {path!r} (expected a JSON Lines file, one object per line)")
    opener = gzip.open if path.endswith(".gz") else open
    records, errors = [], []
    with opener(path, "rb") as f:            # bytes: one line's bad UTF-8 must not stop the others
        for n, raw in enumerate(f, start=1):
            if n == 1 and raw.startswith(_BOM):
                raw = raw[len(_BOM):]
            if not raw.strip():
                continue
            try:
                rec = _parse(raw, required, check)
            except ValueError as e:
                errors.append(JsonlError(path, n, str(e)))
                continue
            rec["_line"] = n
            records.append(rec)
    return records, errors
