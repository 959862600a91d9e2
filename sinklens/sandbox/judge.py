"""Run model-generated code in the sandbox and judge it, so that no program can fake a pass.

`run_check(program, test, entry_point, prompt)`: the program runs in the sandbox this machine
permits (`isolation.probe`), the trusted `test` in the harness beside it (`harness.py`).
`passed` means the harness wrote a per-run nonce on a descriptor only it holds, after
`check(candidate)` returned, *and* exited 0; a program that exits 0 by itself is "unproven" or
"failed", never "passed". Both modes: rlimits (CPU, address space, file size, processes, open
files, no core) and a wall-clock timeout that kills everything.
"""
from __future__ import annotations

import os
import secrets
import select
import shutil
import signal
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

from sinklens.sandbox.config import SandboxConfig, SandboxResult
from sinklens.sandbox.isolation import MARK, drop_to, harness_code, harness_command, probe, warn_fallback
from sinklens.sandbox.reap import reap_orphans
from sinklens.sandbox.wire import encode, frame

_KILL_ALL = "import os, sys; u = int(sys.argv[1]); os.setgroups([]); os.setresgid(u, u, u); " \
            "os.setresuid(u, u, u); os.kill(-1, 9)"


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


def _exited_within(pid: int, deadline: float) -> bool:
    """Wait until child `pid` exits or the monotonic `deadline` passes, without reaping it, so
    that its group id cannot be reused before the caller kills the group."""
    try:
        pidfd = os.pidfd_open(pid)          # readable once the child exits: no polling delay
    except (AttributeError, OSError):       # Python < 3.9 or Linux < 5.3
        pidfd = None
    if pidfd is not None:
        try:
            with select.epoll() as ep:
                ep.register(pidfd, select.EPOLLIN)
                return bool(ep.poll(max(0.0, deadline - time.monotonic())))
        finally:
            os.close(pidfd)
    delay = 0.001
    while os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
        if time.monotonic() >= deadline:
            return False
        time.sleep(delay)
        delay = min(delay * 2, 0.02)
    return True


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
    iso = probe(config.mode, config.network, config.tmpfs_bytes)
    fallback = iso.mode == "fallback"
    if fallback:
        warn_fallback(iso)
    uid = 2_000_000 + secrets.randbelow(1_000_000) if iso.uid == "fresh" else None
    nonce = secrets.token_hex(16)
    outer = tempfile.mkdtemp(prefix=MARK + "-")
    work = os.path.join(outer, "work") if fallback else "/sandbox"
    if fallback:
        os.mkdir(work, 0o700)
        if uid is not None:
            os.chown(work, uid, uid)
            os.chmod(outer, 0o711)          # the program may reach its cwd, not list this one
    file_bytes = config.file_bytes
    if fallback and not iso.tmpfs:          # no quota: (files + open files) x file size <= the tmpfs size
        file_bytes = max(1, min(file_bytes, config.tmpfs_bytes // (config.max_files + config.max_open_files)))
    result_r, result_w = os.pipe()
    harness_cfg = {"result_fd": result_w, "root": os.path.realpath(work), "guard": fallback,
                   "block_net": iso.network != "netns",
                   "tmpfs": config.tmpfs_bytes if fallback and iso.tmpfs else None,
                   "max_entries": config.max_files if fallback and not iso.tmpfs else None,
                   "uid": uid if fallback else None,  # the fallback's harness drops root itself
                   "limits": [config.cpu_seconds, config.memory_bytes, file_bytes,
                              config.max_processes + (0 if uid is not None else _own_tasks()),
                              config.max_open_files]}
    # bwrap runs unprivileged under the fresh uid; the fallback's unshare needs root first.
    launcher = list(iso.launcher) if fallback or uid is None else drop_to(uid) + list(iso.launcher)
    cmd = launcher + harness_command(iso.python, harness_cfg)
    env = {"PATH": "/usr/bin:/bin", "HOME": work, "TMPDIR": work, "LANG": "C.UTF-8",
           "PYTHONIOENCODING": "utf-8"}
    job = encode({"nonce": nonce, "test": test, "entry_point": entry_point, "prompt": prompt})
    payload = harness_code(iso.python) + frame(program.encode("utf-8", "surrogatepass")) + frame(job)
    out_path, err_path = os.path.join(outer, "stdout"), os.path.join(outer, "stderr")
    t0 = time.monotonic()
    proof = b""
    try:
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            proc = subprocess.Popen(cmd, cwd=work if fallback else outer, env=env,
                                    stdin=subprocess.PIPE, stdout=out, stderr=err,
                                    pass_fds=(result_w,), start_new_session=True)
        os.close(result_w)
        try:
            proc.stdin.write(payload)
            proc.stdin.close()
        except OSError:                     # it died before reading: judged below
            pass
        timed_out = not _exited_within(proc.pid, t0 + config.timeout)
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        returncode = proc.wait()
        duration = time.monotonic() - t0
        if uid is not None and not iso.pid_namespace:
            # Processes that left the group (setsid) still run under the sandbox uid: kill them all.
            subprocess.run([iso.python, "-I", "-S", "-c", _KILL_ALL, str(uid)],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=10)
        reap_orphans(proc.pid)              # bwrap's init after every run, more after a kill (probe
                                            # made this process their subreaper)
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


def run_checks(jobs: list[dict], config: SandboxConfig | None = None, workers: int = 2,
               progress: bool = False) -> list[SandboxResult]:
    """`run_check(**job)` for many jobs, `workers` sandboxes at a time (threads only wait)."""
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    config = config or SandboxConfig()
    probe(config.mode, config.network, config.tmpfs_bytes)   # probe once, before the threads start
    with ThreadPoolExecutor(max_workers=workers) as pool:
        it = pool.map(lambda job: run_check(config=config, **job), jobs)
        if progress:
            from tqdm import tqdm
            it = tqdm(it, total=len(jobs), desc="sandbox", unit="prog")
        return list(it)
