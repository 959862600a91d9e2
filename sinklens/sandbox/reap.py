"""Every process a sandboxed run started is reaped by the judge, whatever ended the run.

Two ways a run orphans processes: bubblewrap's outer process exits as soon as it has the
sandbox's exit status, before its child, the PID namespace's init, has exited (every run); and a
run killed from outside (timeout) loses its launcher (bwrap, unshare, the fallback's bare harness)
together with what is below it: unshare's child (the harness), the harness's child (the program)
where no PID namespace holds it. Linux hands an orphan to the nearest ancestor that is a child
subreaper, else to PID 1, which in a container need not reap at all: zombies piled up there, one
per bwrap run and one per timed-out program. So the judge's process makes itself a subreaper
(`become_subreaper`, once) and after each run kills and reaps the orphans that came back to it
(`reap_orphans`): its children that are in a PID namespace below its own (a sandbox's init: no
other code here makes one) or in the run's process group, never the launcher (its `Popen` reaps
it). The launchers of runs still going on in other threads are children too, in this process's
PID namespace and in groups of their own: untouched, so that their `Popen.wait` gets their status.

Standard library only, like the whole package; Linux only (prctl, /proc), where the sandbox runs.
"""
from __future__ import annotations

import functools
import os
import signal

PR_SET_CHILD_SUBREAPER = 36


@functools.lru_cache(maxsize=None)
def become_subreaper() -> bool:
    """Once per process: orphans below this process come back to it instead of PID 1. Not on a
    kernel whose /proc shows no PID namespaces (before 4.1): there the orphans could not be told
    apart from other children, so they stay PID 1's."""
    try:
        with open("/proc/self/status") as f:
            if "\nNSpid:" not in f.read():
                return False
        import ctypes
        return ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):      # no prctl: orphans go to PID 1 as before
        return False


def _status(pid: int) -> dict[str, list[int]] | None:
    """PPid, NSpid, NSpgid of a live or zombie process (pids from this namespace inwards), None if gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            lines = [line.split(":", 1) for line in f if line.startswith(("PPid:", "NSpid:", "NSpgid:"))]
    except OSError:
        return None
    return {k: [int(v) for v in rest.split()] for k, rest in lines}


def children(pid: int) -> list[int]:
    """The processes whose parent is `pid` (/proc/<pid>/task/*/children, else a scan of /proc)."""
    try:
        kids = []
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                kids += [int(c) for c in f.read().split()]
        return kids
    except FileNotFoundError:               # a kernel without CONFIG_PROC_CHILDREN, or pid gone
        if not os.path.exists(f"/proc/{pid}"):
            return []
    except OSError:
        return []
    return [int(p) for p in os.listdir("/proc") if p.isdigit() and ((_status(int(p)) or {}).get("PPid") == [pid])]


def is_orphan_of(st: dict[str, list[int]], launcher: int) -> bool:
    """Is the process described by `st` a sandbox's init, or of the run whose launcher is `launcher`?"""
    return len(st.get("NSpid", ())) > 1 or st.get("NSpgid", [0])[0] == launcher


def reap_orphans(launcher: int) -> int:
    """Kill and reap this process's children that sandboxes left (`is_orphan_of`), repeated until
    a pass finds none (reaping one hands over its own orphans). Returns how many were reaped."""
    me, reaped = os.getpid(), 0
    while True:
        found = 0
        for pid in children(me):
            st = _status(pid)
            if pid == launcher or st is None or st.get("PPid") != [me] or not is_orphan_of(st, launcher):
                continue
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                continue
            try:
                os.waitpid(pid, 0)
                found += 1
            except ChildProcessError:       # reaped by another thread's pass
                pass
        reaped += found
        if not found:
            return reaped
