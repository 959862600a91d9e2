"""What this machine lets the sandbox enforce (`probe`), and the command line that starts the harness.

- **bwrap** (bubblewrap, used whenever it works here): the program sees a read-only system
  (/usr and the interpreter only; no /home, /root, /etc, /run, /var), private size-capped tmpfs
  for its working directory, /tmp and /dev/shm, a fresh /proc in a new PID namespace, a network
  namespace of its own (so no host TCP listener, and with no host socket files mounted, no UNIX
  listener either), `--die-with-parent`, a new session. As root the whole sandbox runs under a
  fresh unprivileged uid (`setpriv`), so the per-uid process limit applies.
- **fallback** (no working bwrap, and only when asked for by name: `auto` refuses to run without
  bwrap rather than fall back without a word): `unshare` namespaces where permitted (mount, network, PID with
  its own /proc; a non-root user gets them inside a user namespace where it is root), in which the
  harness mounts a size-capped tmpfs over the working directory and then drops every privilege
  (as real root: to a fresh uid); and an audit hook in the program's process (`guard.py`). One
  warning per process names what this mode does not protect.

Standard library only, like the whole package: it runs as any user with any interpreter.
"""
from __future__ import annotations

import functools
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import warnings
from dataclasses import dataclass

from sinklens.sandbox.guard import JUDGE_FILE
from sinklens.sandbox.reap import become_subreaper
from sinklens.sandbox.wire import encode, frame

MARK = "sinklens-sandbox"          # in every sandboxed command line, see `owner_mark`
_HERE = os.path.dirname(os.path.abspath(__file__))
_PROBE_UID = 3_999_999
_PID_NAMESPACE = ("--pid", "--fork", "--kill-child", "--mount-proc")


class SandboxUnavailable(RuntimeError):
    """The sandbox asked for cannot be had on this machine (the message says what to do)."""


@dataclass(frozen=True)
class Isolation:
    """What the sandbox enforces on this machine (probed once per process and mode)."""
    mode: str                   # "bwrap" | "fallback"
    launcher: tuple[str, ...]   # command prefix before the interpreter
    python: str                 # interpreter run inside
    network: str                # "netns" | "audit-hook"
    pid_namespace: bool
    uid: str                    # "fresh" (root dropped to a per-run uid) | "same"
    tmpfs: bool = True          # the working directory is a size-capped tmpfs (else: a file count cap)

    def describe(self) -> dict:
        bw = self.mode == "bwrap"
        return {"mode": self.mode, "network": self.network, "pid_namespace": self.pid_namespace,
                "proc": "fresh" if self.pid_namespace else "host",
                "filesystem": "read-only system, private tmpfs" if bw else "audit hook",
                "disk": "private tmpfs" if self.tmpfs else "file count capped (audit hook)",
                "user": "fresh unprivileged uid" if self.uid == "fresh" else "same user, no capabilities",
                "process_creation": "contained (PID namespace, rlimit)" if bw else "blocked (audit hook)",
                "unix_sockets": "no host socket mounted" if bw else "blocked (audit hook)",
                "rlimits": True, "proof": "nonce after check()"}


# Run inside the sandbox by `python -I -S -B -c`: the harness's code object comes first on stdin
# (8-byte size, then marshal data), so the harness is compiled once per judge process, not once
# per program. marshal reads only what the judge wrote there, never anything from the program.
# HARNESS_CODE stays a global: the fallback's program process starts a fresh interpreter from it.
_BOOTSTRAP = """import marshal, os
def read(n):
    b = b""
    while len(b) < n:
        c = os.read(0, n - len(b))
        if not c:
            raise SystemExit(1)
        b += c
    return b
HARNESS_CODE = read(int.from_bytes(read(8), "big"))
exec(marshal.loads(HARNESS_CODE))
"""
_COMPILE = ("import marshal, sys; sys.stdout.buffer.write(marshal.dumps(compile("
            "sys.stdin.buffer.read().decode(), sys.argv[1], 'exec')))")


def owner_mark(pid: int | None = None) -> str:
    """The last argument of every harness command line: MARK and the judge's process id, so that
    a check for leftover sandboxes can tell its own from another process's."""
    return f"{MARK}:{os.getpid() if pid is None else pid}"


@functools.lru_cache(maxsize=None)
def harness_code(python: str) -> bytes:
    """wire.py + guard.py + reference.py + harness.py compiled under JUDGE_FILE by `python` itself (code objects
    differ between Python versions), framed for the start of the harness's stdin."""
    source = "".join(open(os.path.join(_HERE, name), encoding="utf-8").read() + "\n"
                     for name in ("wire.py", "guard.py", "reference.py", "harness.py"))
    try:
        out = subprocess.run([python, "-I", "-S", "-B", "-c", _COMPILE, JUDGE_FILE], input=source.encode(),
                             capture_output=True, timeout=60, check=True).stdout
    except (OSError, subprocess.SubprocessError) as e:
        raise RuntimeError(f"sandbox: {python} could not compile the judge's harness ({e})") from None
    return frame(out)


def harness_command(python: str, cfg: dict) -> list[str]:
    return [python, "-I", "-S", "-B", "-c", _BOOTSTRAP, encode(cfg).hex(), owner_mark()]


def _works(cmd: list[str], cwd: str | None = None, stdin: bytes = b"") -> bool:
    try:
        return subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=cwd,
                              input=stdin, timeout=20).returncode == 0
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


def drop_to(uid: int) -> list[str]:
    return ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--"]


def _bwrap_args(python: str, tmpfs_bytes: int) -> list[str]:
    args = ["--unshare-all", "--die-with-parent", "--new-session", "--ro-bind", "/usr", "/usr"]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(top):
            args += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            args += ["--ro-bind", top, top]
    prefix = _prefix_of(python)
    if not (prefix == "/usr" or prefix.startswith("/usr/")):
        args += ["--ro-bind", prefix, prefix]
    size = str(tmpfs_bytes)
    args += ["--proc", "/proc", "--dev", "/dev",
             "--size", size, "--tmpfs", "/tmp", "--size", size, "--tmpfs", "/dev/shm",
             "--size", size, "--tmpfs", "/sandbox", "--chdir", "/sandbox",
             "--setenv", "HOME", "/sandbox", "--setenv", "TMPDIR", "/tmp"]
    return args


def _harness_starts(launcher: list[str], python: str, uid: int | None, tmpfs: bool) -> bool:
    """Does the harness get through its privileged start (tmpfs, dropping privileges) here?"""
    work = tempfile.mkdtemp(prefix=MARK + "-probe-")
    try:
        cfg = {"probe": True, "root": work, "uid": uid, "tmpfs": (1 << 20) if tmpfs else None,
               "limits": [10, 1 << 30, 1 << 20, 1 << 16, 256]}
        return _works(launcher + harness_command(python, cfg), cwd=work, stdin=harness_code(python))
    finally:
        shutil.rmtree(work, ignore_errors=True)


@functools.lru_cache(maxsize=None)
def probe(mode: str = "auto", network: str = "auto", tmpfs_bytes: int = 64 << 20) -> Isolation:
    """The strongest sandbox this machine permits for `mode`; raises SandboxUnavailable if `mode`
    cannot be had (`auto` without a working bwrap: the fallback must be named)."""
    become_subreaper()      # the probe's sandboxes are the first; the next run reaps what they orphan
    root = os.geteuid() == 0
    python = _interpreter(other_uid=root)
    uid = "fresh" if root and python else "same"   # root runs the program as a fresh uid
    if not python:                       # root, and no interpreter another uid can run
        python = _interpreter(other_uid=False)
    drop = uid == "fresh" and shutil.which("setpriv") is not None    # bwrap's way to that uid
    test = [python, "-I", "-S", "-c", "pass"]
    if mode in ("auto", "bwrap") and shutil.which("bwrap"):
        bw = [shutil.which("bwrap")] + _bwrap_args(python, tmpfs_bytes)
        pre = drop_to(_PROBE_UID) if drop else []
        if _works(pre + bw + test):
            return Isolation("bwrap", tuple(bw), python, "netns", True, "fresh" if drop else "same")
    if mode == "bwrap":
        raise SandboxUnavailable("sandbox mode 'bwrap' requested but bubblewrap is missing or cannot "
                                 "create namespaces here (install the Debian package `bubblewrap`; "
                                 "scripts/sandbox-deps.sh does)")
    if mode == "auto":      # the fallback is no security boundary: only when asked for by name
        raise SandboxUnavailable(
            "sandbox: bubblewrap is missing or cannot create namespaces here, and model-written code runs only "
            "in a real sandbox: install the Debian package `bubblewrap` (scripts/sandbox-deps.sh does), or "
            "accept the fallback by name (`--sandbox fallback`, SandboxConfig(mode='fallback')): an audit hook "
            "and namespaces where permitted, no read-only filesystem, private /tmp or security boundary "
            "(docs/evaluation.md, 'Sandbox and judge')")
    # Fallback: the harness drops root itself (to a fresh uid), after mounting its tmpfs.
    harness_uid = _PROBE_UID if uid == "fresh" else None
    unshare = shutil.which("unshare")
    nets = {"netns": [["--net"]], "auto": [["--net"], []], "audit": [[]]}[network]
    for net in nets if unshare else []:
        for pid in (list(_PID_NAMESPACE), []):
            launcher = [unshare] + ([] if root else ["--map-root-user"]) + net + ["--mount"] + pid
            for tmpfs in (True, False):
                if _harness_starts(launcher, python, harness_uid, tmpfs):
                    return Isolation("fallback", tuple(launcher), python,
                                     "netns" if net else "audit-hook", bool(pid), uid, tmpfs)
    if network == "netns":
        raise RuntimeError("sandbox network='netns' requested but `unshare --net` is not permitted "
                           "here; use network='auto' or 'audit'")
    return Isolation("fallback", (), python, "audit-hook", False, uid, False)


_warned = False


def warn_fallback(iso: Isolation) -> None:
    """Once per process: what the fallback mode does not protect."""
    global _warned
    if _warned:
        return
    _warned = True
    missing = ["a read-only filesystem (files are protected by an audit hook only)",
               "private /tmp and /dev/shm"]
    if not iso.tmpfs:
        missing.append("a disk quota (only the number of files is capped)")
    if not iso.pid_namespace:
        missing.append("a fresh /proc (the host's processes are visible)")
    if iso.network != "netns":
        missing.append("a network namespace (sockets are refused by an audit hook)")
    if iso.uid != "fresh" and os.geteuid() == 0:
        missing.append("a separate uid (the program runs as root)")
    warnings.warn("sandbox: fallback mode, without " + "; ".join(missing)
                  + ". It also fails right programs that bubblewrap mode passes: a thread, importing "
                  "subprocess, _multiprocessing (multiprocessing's queues and locks), ctypes, fcntl or "
                  "mmap, files outside the working directory. Install the Debian package `bubblewrap` "
                  "for the full sandbox.",
                  RuntimeWarning, stacklevel=3)
