"""One writer per folder: an advisory lock that a second process writing the same folder meets.

Each process holds `<folder>/lock.rank<r>` (an `flock`) while it writes there, so a second one with
the same rank (the same `sinklens eval --out`, the same `sinklens train --out`) is refused with a
clear message instead of computing everything again, or two trainings overwriting one checkpoint.
Data-parallel ranks lock different files and run side by side. The kernel drops a flock when its
process dies, kill -9 included, so a killed run never leaves a stale lock and re-running resumes.
The lock is taken before the model loads (a second writer pays no load). Lock files of a run that
wrote something stay behind (removing them would race with a process that has just opened one);
they hold the pid of the last holder.
"""
from __future__ import annotations

import fcntl
import os


class RunDirBusy(RuntimeError):
    """Another process is writing this folder with the same rank."""


class RunLock:
    """Context manager: hold `run_dir/lock.rank<rank>` (creating run_dir) or raise RunDirBusy.
    `who`: the command named in the message ("another sinklens eval is already writing ...").
    Taken before the model loads, so a second writer is refused at once, not after a load of
    minutes; a run refused after that (bad settings found once the model is known) leaves no
    trace: the folders this lock made are removed again when nothing but its lock file was written."""

    def __init__(self, run_dir: str, rank: int = 0, who: str = "sinklens eval"):
        self.run_dir, self.path, self.fd = run_dir, os.path.join(run_dir, f"lock.rank{rank}"), None
        self.who, self.made = who, []

    def __enter__(self) -> "RunLock":
        missing = os.path.abspath(self.run_dir)
        while not os.path.exists(missing):          # the folders made here, innermost first
            self.made.append(missing)
            missing = os.path.dirname(missing)
        os.makedirs(self.run_dir, exist_ok=True)
        self.fd = _flock(self.path, f"another {self.who} is already writing {self.run_dir}")
        os.ftruncate(self.fd, 0)
        os.write(self.fd, f"{os.getpid()}\n".encode())   # for the message the next process prints
        return self

    def __exit__(self, *exc) -> None:
        if self.fd is None:
            return
        if self.made and os.listdir(self.made[0]) == [os.path.basename(self.path)]:
            os.unlink(self.path)                         # nothing but this lock was written: leave no trace
            for folder in self.made:                     # innermost first, while empty
                if os.listdir(folder):
                    break
                os.rmdir(folder)
        os.close(self.fd)                                # closing releases the flock
        self.fd = None


class FileLock:
    """Context manager: hold an flock on the output file `path` itself (created empty when missing,
    never truncated: its writer does that) or raise RunDirBusy: one writer per trace file
    (`sinklens trace --out run.arrow`). A file this lock created and nothing wrote is removed again."""

    def __init__(self, path: str, who: str = "sinklens trace"):
        self.path, self.who, self.fd, self.made = path, who, None, not os.path.exists(path)

    def __enter__(self) -> "FileLock":
        self.fd = _flock(self.path, f"another {self.who} is already writing {self.path}")
        return self

    def __exit__(self, *exc) -> None:
        if self.fd is None:
            return
        if self.made and os.path.isfile(self.path) and os.path.getsize(self.path) == 0:
            os.unlink(self.path)
        os.close(self.fd)
        self.fd = None


def _flock(path: str, busy: str) -> int:
    """An fd of `path` (created when missing) holding its exclusive flock; RunDirBusy(`busy` + the
    holder's pid when a lock file names one) when another process holds it."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.read(fd, 32).decode(errors="replace").strip()
        os.close(fd)
        pid = f" (pid {holder})" if holder.isdigit() else ""
        raise RunDirBusy(f"{busy}{pid}; wait for it or use another --out") from None
    return fd
