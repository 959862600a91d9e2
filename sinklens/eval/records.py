"""Per-sample result files that survive kill -9: append + flush + fsync, one JSON line per sample.

A reader keeps every complete line (valid JSON ending in a newline); a torn last line (the
process died mid-write) is dropped, and `open_for_append` cuts it off before new lines follow,
so a resumed run redoes exactly the samples whose line is missing or torn.
"""
from __future__ import annotations

import glob
import json
import os
import warnings


def read_records(path: str) -> tuple[list[dict], int]:
    """(complete records, byte offset just after the last complete line)."""
    if not os.path.exists(path):
        return [], 0
    with open(path, "rb") as f:
        data = f.read()
    records, good_end, pos = [], 0, 0
    while pos < len(data):
        nl = data.find(b"\n", pos)
        if nl < 0:
            break                                         # torn last line: no newline
        line = data[pos:nl]
        try:
            records.append(json.loads(line))
            good_end = nl + 1
        except json.JSONDecodeError:
            if data.find(b"\n", nl + 1) >= 0:             # garbage in the middle: skip, keep going
                warnings.warn(f"{path}: skipping a corrupt line at byte {pos}")
                good_end = nl + 1
        pos = nl + 1
    return records, good_end


class WriteError(OSError):
    """A file could not be written in full (disk full, file-size limit, I/O error). Whatever was
    being written is gone again (a record's file is cut back to its last complete line), so nothing
    torn is left for the next write to glue onto. `note` (set by the caller) says what was kept."""

    def __init__(self, path: str, cause: OSError):
        super().__init__(cause.errno, cause.strerror or str(cause))
        self.path, self.note = path, None

    def __str__(self) -> str:
        return f"could not write {self.path} ({self.strerror})" + (f"; {self.note}" if self.note else "")


class RecordWriter:
    """Append-only JSONL; each `write` is on disk (fsync) when it returns, whole or not at all."""

    def __init__(self, path: str):
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        _, good_end = read_records(path)
        if os.path.exists(path) and os.path.getsize(path) != good_end:
            with open(path, "r+b") as f:                  # drop the torn tail before appending
                f.truncate(good_end)
        self.path = path
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self.end = good_end                               # byte offset after the last complete line

    def write(self, record: dict) -> None:
        data = memoryview((json.dumps(record, ensure_ascii=False) + "\n").encode("utf-8"))
        try:
            while data:                                   # a short write (at a size limit) is not an error yet
                data = data[os.write(self.fd, data):]
            os.fsync(self.fd)
        except OSError as e:
            self._cut_back()
            raise WriteError(self.path, e) from e
        self.end = os.fstat(self.fd).st_size

    def _cut_back(self) -> None:
        """Remove a partly written line; shrinking a file needs no space, so this works on a full disk."""
        try:
            os.ftruncate(self.fd, self.end)
            os.fsync(self.fd)
        except OSError:
            pass                                          # the reader drops a torn tail on resume anyway

    def close(self) -> None:
        os.close(self.fd)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def shard_files(run_dir: str) -> list[str]:
    return sorted(glob.glob(os.path.join(run_dir, "samples.rank*.jsonl")))


def collect(run_dir: str) -> list[dict]:
    """All complete records of a run directory (every rank's file), one per sample id, by index."""
    by_id: dict[str, dict] = {}
    for path in shard_files(run_dir):
        for rec in read_records(path)[0]:
            by_id.setdefault(rec["id"], rec)
    return sorted(by_id.values(), key=lambda r: r["index"])


def replace_file(path: str, fill) -> None:
    """Replace `path` with what `fill(f)` writes to a binary file, in one step (temporary file,
    fsync, rename): a full disk leaves the old file or none, never a torn one. Raises WriteError."""
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            fill(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise WriteError(path, e) from e


def write_text(path: str, text: str) -> None:
    """Replace `path` with `text` in one step (`replace_file`). Raises WriteError."""
    replace_file(path, lambda f: f.write(text.encode("utf-8")))


def merge(run_dir: str) -> str:
    """Write `samples.jsonl` (all ranks, deduplicated, in sample order); returns its path.
    Atomic (`write_text`): the per-rank files are the data, and re-running merges again."""
    out = os.path.join(run_dir, "samples.jsonl")
    write_text(out, "".join(json.dumps(rec, ensure_ascii=False) + "\n" for rec in collect(run_dir)))
    return out
