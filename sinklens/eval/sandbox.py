"""Run model-generated code in a sandboxed subprocess (never in this process, never via exec).

Layers, outermost first (see docs/evaluation.md, "Sandbox"):

1. **Own session / process group** (`start_new_session`): a wall-clock timeout kills the whole
   group with SIGKILL; the group is also killed after a normal exit, so nothing lingers.
2. **Namespaces via `unshare`**, probed at run time: a fresh *network* namespace (only a
   down loopback: no connection leaves the sandbox, not even to 127.0.0.1 of the host) and a
   fresh *PID* namespace (when its first process exits the kernel kills every process left in
   it, including ones that called setsid() to leave the group). As root: `unshare --net
   --pid`; otherwise an unprivileged user namespace `unshare -rn --pid`. When neither is
   permitted, network is blocked inside the child by an audit hook on `socket.*` events.
3. **Unprivileged user** (only when we are root): the child runs under a fresh high uid
   (`setpriv`), so the kernel refuses writes to anything it does not own, and RLIMIT_NPROC
   (ignored for root) applies to it alone.
4. **rlimits**, set by the child's preamble before any generated code runs: CPU seconds,
   address space, file size, number of processes, open files, no core dumps.
5. **Audit hook** in the child (CPython `sys.addaudithook`, cannot be removed from Python
   code): writes, deletes, renames, chmod/chown outside the temporary directory, spawning
   processes (os.system, subprocess, exec*, posix_spawn), signalling other processes and
   ctypes raise PermissionError. This is what protects files when layer 3 is unavailable.
6. **Fresh temporary working directory** (HOME and TMPDIR point into it), removed afterwards.

Which layers were in force is part of every `SandboxResult.isolation` and of every eval record.
"""
from __future__ import annotations

import functools
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field


@dataclass
class SandboxConfig:
    timeout: float = 10.0               # wall-clock seconds before the whole group is killed
    cpu_seconds: int = 10               # RLIMIT_CPU
    memory_bytes: int = 1 << 30         # RLIMIT_AS (address space)
    file_bytes: int = 16 << 20          # RLIMIT_FSIZE (largest file the child may write)
    max_processes: int = 32             # RLIMIT_NPROC (for the sandbox uid)
    max_open_files: int = 256           # RLIMIT_NOFILE
    network: str = "auto"               # "auto" (netns if permitted, else audit hook) | "netns" | "audit"
    output_limit: int = 4096            # characters of stdout/stderr kept (tail)

    def __post_init__(self):
        if self.network not in ("auto", "netns", "audit"):
            raise ValueError(f"SandboxConfig.network must be 'auto', 'netns' or 'audit', got {self.network!r}")
        if self.timeout <= 0:
            raise ValueError(f"SandboxConfig.timeout must be > 0 seconds, got {self.timeout}")


@dataclass
class SandboxResult:
    passed: bool                # exit code 0 within the limits
    status: str                 # "passed" | "failed" | "timeout" | "signal:<NAME>"
    returncode: int | None
    duration: float             # wall-clock seconds
    stdout: str
    stderr: str
    isolation: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Isolation:
    """What the sandbox can enforce on this machine (probed once per process)."""
    launcher: tuple[str, ...]   # command prefix, e.g. ("unshare", "--net", "--pid", "--fork", "--kill-child")
    network: str                # "netns" | "audit-hook"
    pid_namespace: bool
    drop_uid: bool              # root: run the child under a fresh unprivileged uid

    def describe(self) -> dict:
        return {"network": self.network, "pid_namespace": self.pid_namespace,
                "user": "fresh unprivileged uid" if self.drop_uid else "same user",
                "fs_guard": "audit-hook", "rlimits": True, "process_group": True}


def _works(cmd: list[str]) -> bool:
    try:
        return subprocess.run(cmd + ["true"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@functools.lru_cache(maxsize=None)
def probe_isolation(network: str = "auto") -> Isolation:
    """Find the strongest launcher this machine permits; `network="netns"` insists on a namespace."""
    is_root = os.geteuid() == 0
    drop_uid = is_root and shutil.which("setpriv") is not None
    unshare = shutil.which("unshare")
    if network != "audit" and unshare:
        base = [unshare, "--net"] if is_root else [unshare, "--map-root-user", "--net"]
        for extra, pid in ((["--pid", "--fork", "--kill-child"], True), ([], False)):
            if _works(base + extra):
                return Isolation(tuple(base + extra), "netns", pid, drop_uid)
    if network == "netns":
        raise RuntimeError("sandbox network='netns' requested but `unshare --net` is not permitted here "
                           "(no unshare binary, or user namespaces disabled); use network='auto' or 'audit'")
    return Isolation((), "audit-hook", False, drop_uid)


# The child's first code: limits and audit hook, then the program (argv[1]) as __main__.
# It runs under `python -I -B` (isolated: no user site, no PYTHONPATH, no .pyc writes).
_PREAMBLE = r'''
import os, sys, resource
_cfg = dict(arg.split("=", 1) for arg in sys.argv[2:])
def _lim(res, value):
    value = int(value)
    soft, hard = resource.getrlimit(res)
    if hard != resource.RLIM_INFINITY:
        value = min(value, hard)
    resource.setrlimit(res, (value, value))
_nproc = int(_cfg["nproc"])
if _cfg["same_user"] == "1":
    # Not root: RLIMIT_NPROC counts every task of this user, so allow what already runs plus ours.
    _uid, _tasks = os.getuid(), 0
    for _p in os.listdir("/proc"):
        if _p.isdigit():
            try:
                _st = open(f"/proc/{_p}/status").read()
            except OSError:
                continue
            _f = dict(l.split(":", 1) for l in _st.splitlines() if ":" in l)
            if int(_f["Uid"].split()[0]) == _uid:
                _tasks += int(_f["Threads"])
    _nproc += _tasks
_lim(resource.RLIMIT_CPU, _cfg["cpu"])
_lim(resource.RLIMIT_AS, _cfg["mem"])
_lim(resource.RLIMIT_FSIZE, _cfg["fsize"])
_lim(resource.RLIMIT_NPROC, _nproc)
_lim(resource.RLIMIT_NOFILE, _cfg["nofile"])
_lim(resource.RLIMIT_CORE, 0)

_ROOT = os.path.realpath(os.getcwd())
_BLOCK_NET = _cfg["block_net"] == "1"
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
_PATH_EVENTS = {"os.remove": 1, "os.rmdir": 1, "os.rename": 2, "os.replace": 2, "os.mkdir": 1,
                "os.chmod": 1, "os.chown": 1, "os.truncate": 1, "os.link": 2, "os.symlink": 2,
                "os.utime": 1, "shutil.rmtree": 1, "shutil.move": 2, "shutil.copyfile": 2,
                "shutil.chown": 1, "os.chflags": 1, "os.lchflags": 1, "os.setxattr": 1,
                "os.removexattr": 1, "os.mkfifo": 1, "os.mknod": 1}
_SPAWN = {"os.system", "os.exec", "os.posix_spawn", "os.spawn", "subprocess.Popen", "os.startfile",
          "os.kill", "os.killpg", "os.forkpty", "pty.spawn", "signal.pthread_kill", "os.pidfd_open"}
_realpath, _fspath, _isinstance = os.path.realpath, os.fspath, isinstance

def _inside(p):
    if _isinstance(p, int):                        # a file descriptor already granted
        return True
    p = _realpath(_fspath(p))
    if _isinstance(p, bytes):
        p = p.decode("utf-8", "surrogateescape")
    return p == _ROOT or p.startswith(_ROOT + os.sep)

def _guard(event, args):
    if event in _SPAWN or event.startswith("ctypes."):
        raise PermissionError(f"sandbox: {event} is not allowed")
    if _BLOCK_NET and event.startswith("socket."):
        raise PermissionError(f"sandbox: network ({event}) is not allowed")
    if event == "open":
        path, mode, flags = args
        if flags is not None and flags & _WRITE_FLAGS and not _inside(path):
            raise PermissionError(f"sandbox: writing outside the working directory: {path!r}")
    else:
        n = _PATH_EVENTS.get(event)
        if n:
            for p in args[:n]:
                if p is not None and not _inside(p):
                    raise PermissionError(f"sandbox: {event} outside the working directory: {p!r}")

sys.addaudithook(_guard)
del _lim, _cfg
import runpy
sys.argv = [sys.argv[1]]
runpy.run_path(sys.argv[0], run_name="__main__")
'''


def _tail(path: str, limit: int) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - limit))
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def run_program(source: str, config: SandboxConfig | None = None) -> SandboxResult:
    """Run `source` as a Python program in the sandbox; passed = exit code 0 within the limits."""
    config = config or SandboxConfig()
    iso = probe_isolation(config.network)
    uid = 2_000_000 + secrets.randbelow(1_000_000) if iso.drop_uid else None
    outer = tempfile.mkdtemp(prefix="sinklens-sandbox-")
    work = os.path.join(outer, "work")
    os.mkdir(work, 0o700)
    prog = os.path.join(work, "program.py")
    with open(prog, "w", encoding="utf-8") as f:
        f.write(source)
    if uid is not None:
        os.chown(work, uid, uid)
        os.chown(prog, uid, uid)
        os.chmod(outer, 0o711)              # the child may traverse to its cwd, not list or write here
    cmd = list(iso.launcher)
    if uid is not None:
        cmd += ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--"]
    cmd += [sys.executable, "-I", "-B", "-c", _PREAMBLE, prog,
            f"cpu={config.cpu_seconds}", f"mem={config.memory_bytes}", f"fsize={config.file_bytes}",
            f"nproc={config.max_processes}", f"nofile={config.max_open_files}",
            f"block_net={int(iso.network != 'netns')}", f"same_user={int(uid is None)}"]
    env = {"PATH": "/usr/bin:/bin", "HOME": work, "TMPDIR": work, "LANG": "C.UTF-8",
           "PYTHONIOENCODING": "utf-8"}
    out_path, err_path = os.path.join(outer, "stdout"), os.path.join(outer, "stderr")
    t0 = time.monotonic()
    timed_out = False
    try:
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            proc = subprocess.Popen(cmd, cwd=work, env=env, stdin=subprocess.DEVNULL, stdout=out,
                                    stderr=err, start_new_session=True)
        # Wait without reaping (WNOWAIT) so the group id cannot be reused before we kill the group.
        delay = 0.001
        while True:
            info = os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            if info is not None:
                break
            if time.monotonic() - t0 > config.timeout:
                timed_out = True
                break
            time.sleep(delay)
            delay = min(delay * 2, 0.02)
        _kill_group(proc.pid)
        returncode = proc.wait()
        duration = time.monotonic() - t0
        if uid is not None and not iso.pid_namespace:
            # Processes that left the group (setsid) still run under the sandbox uid: kill them all.
            subprocess.run(["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--",
                            sys.executable, "-I", "-c", "import os; os.kill(-1, 9)"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=10)
        stdout, stderr = _tail(out_path, config.output_limit), _tail(err_path, config.output_limit)
    finally:
        shutil.rmtree(outer, ignore_errors=True)
    if timed_out:
        status, returncode = "timeout", None
    elif returncode == 0:
        status = "passed"
    elif returncode < 0 or returncode > 128:
        # unshare/setpriv report a killed child as 128 + signal number
        sig = -returncode if returncode < 0 else returncode - 128
        try:
            status = f"signal:{signal.Signals(sig).name}"
        except ValueError:
            status = "failed"
    else:
        status = "failed"
    return SandboxResult(passed=status == "passed", status=status, returncode=returncode,
                         duration=duration, stdout=stdout, stderr=stderr,
                         isolation=iso.describe())


def run_programs(sources: list[str], config: SandboxConfig | None = None, workers: int = 2,
                 progress: bool = False) -> list[SandboxResult]:
    """Run many programs, `workers` sandboxes at a time (threads only wait; the work is in the children)."""
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    config = config or SandboxConfig()
    probe_isolation(config.network)                 # probe once, before the threads start
    with ThreadPoolExecutor(max_workers=workers) as pool:
        it = pool.map(lambda s: run_program(s, config), sources)
        if progress:
            from tqdm import tqdm
            it = tqdm(it, total=len(sources), desc="sandbox", unit="prog")
        return list(it)
