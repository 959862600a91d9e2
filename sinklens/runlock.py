"""One writer per folder: an advisory lock that a second process writing the same folder meets.

Each process holds `<folder>/lock.rank<r>` (an `flock`) while it writes there, so a second one with
the same rank (the same `sinklens eval --out`, the same `sinklens train --out`) is refused with a
clear message instead of computing everything again, or two trainings overwriting one checkpoint.
Data-parallel ranks lock different files and run side by side. The kernel drops a flock when its
process dies, kill -9 included, so a killed run never leaves a stale lock and re-running resumes.
Lock files stay behind (removing them would race with a process that has just opened one); they
hold the pid of the last holder.
"""
from __future__ import annotations

import fcntl
import os


class RunDirBusy(RuntimeError):
    """Another process is writing this folder with the same rank."""


class RunLock:
    """Context manager: hold `run_dir/lock.rank<rank>` (creating run_dir) or raise RunDirBusy.
    `who`: the command named in the message ("another sinklens eval is already writing ...")."""

    def __init__(self, run_dir: str, rank: int = 0, who: str = "sinklens eval"):
        self.run_dir, self.path, self.fd = run_dir, os.path.join(run_dir, f"lock.rank{rank}"), None
        self.who = who

    def __enter__(self) -> "RunLock":
        os.makedirs(self.run_dir, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 32).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise RunDirBusy(f"another {self.who} is already writing {self.run_dir} (pid {holder}); "
                             "wait for it or use another --out") from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())        # for the message the next process prints
        self.fd = fd
        return self

    def __exit__(self, *exc) -> None:
        if self.fd is not None:
            os.close(self.fd)                            # closing releases the flock
            self.fd = None
