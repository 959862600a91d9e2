"""Run model-generated code in a sandbox, and judge it so that no program can fake a pass.

Two modes (docs/evaluation.md, "Sandbox", lists what each guarantees):

- **bwrap** (bubblewrap, used whenever it works here): the program sees a read-only system
  (/usr and the interpreter only; no /home, /root, /etc, /run, /var), private size-capped tmpfs
  for its working directory, /tmp and /dev/shm, a fresh /proc in a new PID namespace, a network
  namespace of its own (so no host TCP listener, and with no host socket files mounted, no UNIX
  listener either), `--die-with-parent`, a new session. As root the whole sandbox runs under a
  fresh unprivileged uid (`setpriv`), so the per-uid process limit applies.
- **fallback** (no working bwrap): `unshare` namespaces where permitted (network, PID with its
  own /proc), a fresh uid when root, and an audit hook in the program's process
  (`judge_harness.install_guard`): no writes, deletes or renames outside the working directory
  (dir_fd-relative calls resolved through /proc/self/fd), no process creation of any kind
  (fork, exec, `_posixsubprocess`, multiprocessing), no UNIX-domain sockets, no ctypes. One
  warning per process names what this mode does not protect.

Both: rlimits (CPU, address space, file size, processes, open files, no core), a wall-clock
timeout that kills everything, and the two-process judge of `judge_harness`: `passed` means the
trusted harness printed a per-run nonce after `check(candidate)` returned *and* exited 0; a
program that exits 0 by itself is "unproven" or "failed", never "passed".

This module imports only the standard library, so it can run as any user with any interpreter.
"""
from __future__ import annotations

import functools
import json
import os
import secrets
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field

_HARNESS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "judge_harness.py")
MARK = "sinklens-sandbox"          # in every sandboxed command line (tests look for leftovers)


@dataclass
class SandboxConfig:
    timeout: float = 10.0               # wall-clock seconds before everything is killed
    cpu_seconds: int = 10               # RLIMIT_CPU
    memory_bytes: int = 1 << 30         # RLIMIT_AS (address space)
    file_bytes: int = 16 << 20          # RLIMIT_FSIZE (largest file the program may write)
    max_processes: int = 32             # RLIMIT_NPROC (for the sandbox uid)
    max_open_files: int = 256           # RLIMIT_NOFILE
    tmpfs_bytes: int = 64 << 20         # size of each private tmpfs (bwrap mode)
    mode: str = "auto"                  # "auto" (bwrap if it works, else fallback) | "bwrap" | "fallback"
    network: str = "auto"               # fallback only: "auto" (netns if permitted) | "netns" | "audit"
    output_limit: int = 4096            # characters of stdout/stderr kept (tail)

    def __post_init__(self):
        if self.mode not in ("auto", "bwrap", "fallback"):
            raise ValueError(f"SandboxConfig.mode must be 'auto', 'bwrap' or 'fallback', got {self.mode!r}")
        if self.network not in ("auto", "netns", "audit"):
            raise ValueError(f"SandboxConfig.network must be 'auto', 'netns' or 'audit', got {self.network!r}")
        if not self.timeout > 0:
            raise ValueError(f"SandboxConfig.timeout must be > 0 seconds, got {self.timeout}")
        for name in ("cpu_seconds", "memory_bytes", "file_bytes", "max_processes",
                     "max_open_files", "tmpfs_bytes", "output_limit"):
            if not getattr(self, name) > 0:
                raise ValueError(f"SandboxConfig.{name} must be > 0, got {getattr(self, name)}")


@dataclass
class SandboxResult:
    passed: bool                # the harness proved check() returned (nonce seen) and exit 0
    status: str                 # "passed" | "failed" | "unproven" | "timeout" | "signal:<NAME>"
    returncode: int | None
    duration: float             # wall-clock seconds
    stdout: str
    stderr: str
    isolation: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Isolation:
    """What the sandbox enforces on this machine (probed once per process and mode)."""
    mode: str                   # "bwrap" | "fallback"
    launcher: tuple[str, ...]   # command prefix before the interpreter
    python: str                 # interpreter run inside
    network: str                # "netns" | "audit-hook"
    pid_namespace: bool
    uid: str                    # "fresh" (root dropped to a per-run uid) | "same"

    def describe(self) -> dict:
        bw = self.mode == "bwrap"
        return {"mode": self.mode, "network": self.network, "pid_namespace": self.pid_namespace,
                "proc": "fresh" if self.pid_namespace else "host",
                "filesystem": "read-only system, private tmpfs" if bw else "audit hook",
                "user": "fresh unprivileged uid" if self.uid == "fresh" else "same user",
                "process_creation": "contained (PID namespace, rlimit)" if bw else "blocked (audit hook)",
                "unix_sockets": "no host socket mounted" if bw else "blocked (audit hook)",
                "rlimits": True, "proof": "nonce after check()"}


def _works(cmd: list[str]) -> bool:
    try:
        return subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              stdin=subprocess.DEVNULL, timeout=20).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def _world_runnable(path: str) -> bool:
    """Could another uid run `path`? (every directory on the way o+x, the file o+rx)"""
    path = os.path.realpath(path)
    parts = path.split(os.sep)
    for i in range(2, len(parts)):
        if not os.stat(os.sep.join(parts[:i]) or os.sep).st_mode & stat.S_IXOTH:
            return False
    return os.stat(path).st_mode & (stat.S_IROTH | stat.S_IXOTH) == (stat.S_IROTH | stat.S_IXOTH)


def _interpreter(other_uid: bool) -> str:
    """This process's base interpreter, or a system one when another uid could not run it."""
    own = os.path.realpath(getattr(sys, "_base_executable", sys.executable) or sys.executable)
    if not other_uid or _world_runnable(own):
        return own
    for cand in ("/usr/bin/python3", "/usr/local/bin/python3", "/bin/python3"):
        if os.path.exists(cand) and _world_runnable(cand):
            return os.path.realpath(cand)
    return ""


def _prefix_of(python: str) -> str:
    """The installation prefix of an interpreter (…/bin/python3.x -> …)."""
    return os.path.dirname(os.path.dirname(python))


def _drop(uid: int) -> list[str]:
    return ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--"]


def _bwrap_args(python: str, config: SandboxConfig) -> list[str]:
    args = ["--unshare-all", "--die-with-parent", "--new-session", "--ro-bind", "/usr", "/usr"]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(top):
            args += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            args += ["--ro-bind", top, top]
    prefix = _prefix_of(python)
    if not (prefix == "/usr" or prefix.startswith("/usr/")):
        args += ["--ro-bind", prefix, prefix]
    size = str(config.tmpfs_bytes)
    args += ["--proc", "/proc", "--dev", "/dev",
             "--size", size, "--tmpfs", "/tmp", "--size", size, "--tmpfs", "/dev/shm",
             "--size", size, "--tmpfs", "/sandbox", "--chdir", "/sandbox",
             "--setenv", "HOME", "/sandbox", "--setenv", "TMPDIR", "/tmp"]
    return args


@functools.lru_cache(maxsize=None)
def probe(mode: str = "auto", network: str = "auto") -> Isolation:
    """The strongest sandbox this machine permits for `mode`; raises if `mode` cannot be had."""
    root = os.geteuid() == 0
    drop = root and shutil.which("setpriv") is not None
    python = _interpreter(other_uid=drop)
    if not python:                       # root, and no interpreter another uid can run
        drop, python = False, _interpreter(other_uid=False)
    uid = "fresh" if drop else "same"
    test = [python, "-I", "-S", "-c", "pass"]
    if mode in ("auto", "bwrap") and shutil.which("bwrap"):
        bw = [shutil.which("bwrap")] + _bwrap_args(python, SandboxConfig())
        pre = _drop(3_999_999) if drop else []
        if _works(pre + bw + test):
            return Isolation("bwrap", tuple(bw), python, "netns", True, uid)
    if mode == "bwrap":
        raise RuntimeError("sandbox mode 'bwrap' requested but bubblewrap is missing or cannot "
                           "create namespaces here (install the Debian package `bubblewrap`; "
                           "scripts/sandbox-deps.sh does)")
    unshare = shutil.which("unshare")
    if network != "audit" and unshare:
        base = [unshare, "--net"] if root else [unshare, "--map-root-user", "--net"]
        pid = ["--pid", "--fork", "--kill-child", "--mount-proc"]
        for extra, has_pid in ((pid, True), ([], False)):
            if _works(base + extra + (_drop(3_999_999) if drop else []) + test):
                return Isolation("fallback", tuple(base + extra), python, "netns", has_pid, uid)
    if network == "netns":
        raise RuntimeError("sandbox network='netns' requested but `unshare --net` is not permitted "
                           "here; use network='auto' or 'audit'")
    return Isolation("fallback", (), python, "audit-hook", False, uid)


_warned = False


def _warn_fallback(iso: Isolation, requested: bool) -> None:
    """Once per process: what the fallback mode does not protect."""
    global _warned
    if _warned:
        return
    _warned = True
    missing = ["a read-only filesystem (files are protected by an audit hook only)",
               "private /tmp and /dev/shm"]
    if not iso.pid_namespace:
        missing.append("a fresh /proc (the host's processes are visible)")
    if iso.network != "netns":
        missing.append("a network namespace (sockets are refused by an audit hook)")
    if iso.uid != "fresh" and os.geteuid() == 0:
        missing.append("a separate uid (the program runs as root)")
    why = "fallback mode requested" if requested else "bubblewrap unavailable, fallback mode"
    warnings.warn(f"sandbox: {why}, without " + "; ".join(missing)
                  + ". Install the Debian package `bubblewrap` for the full sandbox.",
                  RuntimeWarning, stacklevel=3)


def _own_tasks() -> int:
    """Threads this uid already runs (RLIMIT_NPROC counts them all, so a shared uid adds them)."""
    uid, tasks = os.getuid(), 0
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                with open(f"/proc/{p}/status") as f:
                    fields = dict(line.split(":", 1) for line in f if ":" in line)
            except OSError:
                continue
            if int(fields["Uid"].split()[0]) == uid:
                tasks += int(fields["Threads"])
    return tasks


def _tail(path: str, limit: int) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - limit))
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


def _frame(obj: bytes) -> bytes:
    return len(obj).to_bytes(8, "big") + obj


def _status(returncode: int, proven: bool) -> str:
    if returncode == 0:
        return "passed" if proven else "unproven"
    if returncode < 0 or returncode > 128:
        # bwrap / unshare / setpriv report a killed child as 128 + signal number
        try:
            return f"signal:{signal.Signals(-returncode if returncode < 0 else returncode - 128).name}"
        except ValueError:
            return "failed"
    return "failed"


def run_check(program: str, test: str | None = None, entry_point: str | None = None,
              prompt: str | None = None, config: SandboxConfig | None = None) -> SandboxResult:
    """Judge `program`: run it in the sandbox, then the trusted `test`'s `check(entry_point)`.

    `prompt` (trusted, e.g. HumanEval's) supplies the test's helper functions; without it the
    test sees the program's functions as remote calls. With `test=None` the run passes when the
    program runs to its end (an exit of any kind before that fails).
    """
    if test is not None and not entry_point:
        raise ValueError("run_check: a test needs the entry_point it checks")
    config = config or SandboxConfig()
    iso = probe(config.mode, config.network)
    if iso.mode == "fallback":
        _warn_fallback(iso, config.mode == "fallback")
    uid = 2_000_000 + secrets.randbelow(1_000_000) if iso.uid == "fresh" else None
    nonce = secrets.token_hex(16)
    outer = tempfile.mkdtemp(prefix=MARK + "-")
    work = "/sandbox" if iso.mode == "bwrap" else os.path.join(outer, "work")
    if iso.mode == "fallback":
        os.mkdir(work, 0o700)
        if uid is not None:
            os.chown(work, uid, uid)
            os.chmod(outer, 0o711)          # the program may reach its cwd, not list this one
    result_r, result_w = os.pipe()
    harness_cfg = {"result_fd": result_w, "root": os.path.realpath(work), "guard": iso.mode == "fallback",
                   "block_net": iso.network != "netns",
                   "limits": [config.cpu_seconds, config.memory_bytes, config.file_bytes,
                              config.max_processes + (0 if uid is not None else _own_tasks()),
                              config.max_open_files]}
    with open(_HARNESS, encoding="utf-8") as f:
        harness = f.read()
    drop = _drop(uid) if uid is not None else []
    # bwrap runs unprivileged under the fresh uid; unshare needs root first, then drops it.
    cmd = drop + list(iso.launcher) if iso.mode == "bwrap" else list(iso.launcher) + drop
    cmd += [iso.python, "-I", "-S", "-B", "-c", _LIMITS + harness, json.dumps(harness_cfg), MARK]
    env = {"PATH": "/usr/bin:/bin", "HOME": work, "TMPDIR": work, "LANG": "C.UTF-8",
           "PYTHONIOENCODING": "utf-8"}
    job = json.dumps({"nonce": nonce, "test": test, "entry_point": entry_point, "prompt": prompt})
    payload = _frame(program.encode("utf-8", "surrogatepass")) + _frame(job.encode())
    out_path, err_path = os.path.join(outer, "stdout"), os.path.join(outer, "stderr")
    t0 = time.monotonic()
    timed_out = False
    proof = b""
    try:
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            proc = subprocess.Popen(cmd, cwd=work if iso.mode == "fallback" else outer, env=env,
                                    stdin=subprocess.PIPE, stdout=out, stderr=err,
                                    pass_fds=(result_w,), start_new_session=True)
        os.close(result_w)
        try:
            proc.stdin.write(payload)
            proc.stdin.close()
        except OSError:                     # it died before reading: judged below
            pass
        # Wait without reaping (WNOWAIT) so the group id cannot be reused before we kill the group.
        delay = 0.001
        while os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
            if time.monotonic() - t0 > config.timeout:
                timed_out = True
                break
            time.sleep(delay)
            delay = min(delay * 2, 0.02)
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        returncode = proc.wait()
        duration = time.monotonic() - t0
        if uid is not None and not iso.pid_namespace:
            # Processes that left the group (setsid) still run under the sandbox uid: kill them all.
            subprocess.run(_drop(uid) + [iso.python, "-I", "-S", "-c", "import os; os.kill(-1, 9)"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=10)
        os.set_blocking(result_r, False)
        try:
            proof = os.read(result_r, 64)
        except BlockingIOError:
            pass
        stdout, stderr = _tail(out_path, config.output_limit), _tail(err_path, config.output_limit)
    finally:
        os.close(result_r)
        shutil.rmtree(outer, ignore_errors=True)
    if timed_out:
        status, returncode = "timeout", None
    else:
        status = _status(returncode, proof == nonce.encode())
    return SandboxResult(passed=status == "passed", status=status, returncode=returncode,
                         duration=duration, stdout=stdout, stderr=stderr,
                         isolation=iso.describe())


def run_program(source: str, config: SandboxConfig | None = None) -> SandboxResult:
    """Run `source` in the sandbox; passed = it ran to its end (an early exit, even 0, fails)."""
    return run_check(source, config=config)


def run_checks(jobs: list[dict], config: SandboxConfig | None = None, workers: int = 2,
               progress: bool = False) -> list[SandboxResult]:
    """`run_check(**job)` for many jobs, `workers` sandboxes at a time (threads only wait)."""
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    config = config or SandboxConfig()
    probe(config.mode, config.network)          # probe once, before the threads start
    with ThreadPoolExecutor(max_workers=workers) as pool:
        it = pool.map(lambda job: run_check(config=config, **job), jobs)
        if progress:
            from tqdm import tqdm
            it = tqdm(it, total=len(jobs), desc="sandbox", unit="prog")
        return list(it)


def run_programs(sources: list[str], config: SandboxConfig | None = None, workers: int = 2,
                 progress: bool = False) -> list[SandboxResult]:
    return run_checks([{"program": s} for s in sources], config, workers, progress)


# Prepended to the harness: the rlimits, set before anything else runs.
_LIMITS = r'''
import json as _j, resource as _r, sys as _s
for _res, _v in zip((_r.RLIMIT_CPU, _r.RLIMIT_AS, _r.RLIMIT_FSIZE, _r.RLIMIT_NPROC, _r.RLIMIT_NOFILE,
                     _r.RLIMIT_CORE), _j.loads(_s.argv[1])["limits"] + [0]):
    _hard = _r.getrlimit(_res)[1]
    _v = _v if _hard == _r.RLIM_INFINITY else min(_v, _hard)
    _r.setrlimit(_res, (_v, _v))
del _j, _r, _s, _res, _v, _hard
'''
