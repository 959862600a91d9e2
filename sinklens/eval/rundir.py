"""A run directory's guards: one writer per rank (lock), and whole-file writes for its small files.

Lock: each process holds `lock.rank<r>` (an advisory `flock`) while it writes a run directory, so
a second process with the same rank into the same `--out` is refused with a clear message
instead of silently computing every sample again. Data-parallel ranks lock different files and
run side by side. The kernel drops a flock when its process dies, kill -9 included, so a killed
run never leaves a stale lock and re-running resumes. Lock files stay behind (removing them
would race with a process that has just opened one); they hold the pid of the last holder.
"""
from __future__ import annotations

import fcntl
import json
import os

from sinklens.eval.records import WriteError, write_text  # noqa: F401  (re-exported)


def recorded_model_name(name: str) -> str:
    """How a run records --model, so that the same local folder typed another way (`./m/`, `m`)
    resumes its run instead of being refused as another model; an alias or hub id as given."""
    return os.path.normpath(name) if os.path.isdir(name) else name


class RunDirBusy(RuntimeError):
    """Another process is writing this run directory with the same rank."""


class RunLock:
    """Context manager: hold `run_dir/lock.rank<rank>` (creating run_dir) or raise RunDirBusy."""

    def __init__(self, run_dir: str, rank: int = 0):
        self.run_dir, self.path, self.fd = run_dir, os.path.join(run_dir, f"lock.rank{rank}"), None

    def __enter__(self) -> "RunLock":
        os.makedirs(self.run_dir, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 32).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise RunDirBusy(f"another sinklens eval is already writing {self.run_dir} (pid {holder}); "
                             "wait for it or use another --out") from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())        # for the message the next process prints
        self.fd = fd
        return self

    def __exit__(self, *exc) -> None:
        if self.fd is not None:
            os.close(self.fd)                            # closing releases the flock
            self.fd = None


def write_json(path: str, obj) -> None:
    write_text(path, json.dumps(obj, indent=2, default=str) + "\n")
