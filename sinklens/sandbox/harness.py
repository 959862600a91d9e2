"""The judge's harness: the trusted program that runs *inside* the sandbox (stdlib only).

`isolation.harness_command` starts it as `python -I -S -B -c <bootstrap> <config> <mark>`; the
bootstrap reads the harness's code object from stdin: `wire.py` + `guard.py` + `reference.py` +
this file, compiled once per judge process under the file name `guard.JUDGE_FILE` by the
interpreter that runs it (`isolation.harness_code`). sinklens never imports it. Two processes, so that a pass can be
proven:

    harness (trusted)                          program (untrusted, forked before any secret exists)
    ---------------------------------------    ------------------------------------------------
    rlimits; mount the tmpfs (fallback);
    drop every privilege; non-dumpable
    read the program from stdin
    fork ------------------------------------> close stdin and every other descriptor;
    (fallback: send code + program on a pipe)  fallback mode: RLIMIT_NPROC 0, exec a fresh
                                               interpreter, install the guard (`restart_clean`);
                                               every mode: the reference's rule (`reference.py`);
                                               exec the program
    read nonce + test from stdin               report the names it defines  (or die trying)
    exec the prompt + test, call               answer calls: candidate(*args) -> plain data
      check(candidate) over the pipe  <------>
    kill the program; write the nonce
    on the result descriptor; exit 0

Why each piece:
- The nonce and the test are read only after the fork, by the harness alone, and the harness is
  non-dumpable: its memory and descriptors (/proc/<pid>/mem, ptrace, /proc/<pid>/fd) are closed
  to every process that lacks CAP_SYS_PTRACE in the harness's user namespace. The program has no
  capability at all: the harness dropped them before forking (`drop_privileges`). That matters
  where the launcher makes the harness root of its own user namespace (a non-root user's
  fallback, `unshare --map-root-user`, needed to mount the tmpfs): root there holds
  CAP_SYS_PTRACE over everything in that namespace, the harness included, and a program that
  kept it read the test out of the harness's memory.
- `sys.exit(0)`, `os._exit(0)`, atexit hooks or `SystemExit` at import end the *program*, which
  the harness sees as a broken pipe: judged failed. Only the harness writes the nonce, only
  after `check` returned.
- Values cross the pipe as plain data (`wire.py`).
- The test's helpers (HumanEval 32's `poly`, 38's `encode_cyclic`) come from the trusted prompt
  executed here, not from the completion, which could redefine them.
"""
import os
import sys

# send / recv / encode / decode / frame / write_all / read_exact come from wire.py,
# install_guard from guard.py and apply_reference_rule from reference.py, which stand in front of
# this file in the harness's code.

PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_CAPBSET_DROP, PR_SET_SECUREBITS = 1, 4, 24, 28
PR_SET_NO_NEW_PRIVS, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 38, 47, 4
SECURE_ALL = 0xEF                   # NOROOT, NO_SETUID_FIXUP, KEEP_CAPS off, NO_CAP_AMBIENT_RAISE; locked
MS_NOSUID, MS_NODEV = 2, 4
SIGKILL = 9                         # a constant: the `signal` module would import `enum`


def libc():
    import ctypes
    return ctypes.CDLL(None, use_errno=True)


def set_limits(limits):
    """rlimits, lowest of ours and the hard limit: CPU, address space, file size, processes,
    open files; no core file."""
    import resource as r
    for res, v in zip((r.RLIMIT_CPU, r.RLIMIT_AS, r.RLIMIT_FSIZE, r.RLIMIT_NPROC, r.RLIMIT_NOFILE,
                       r.RLIMIT_CORE), limits + [0]):
        hard = r.getrlimit(res)[1]
        v = v if hard == r.RLIM_INFINITY else min(v, hard)
        r.setrlimit(res, (v, v))


def mount_tmpfs(root, size, uid):
    """A private tmpfs of `size` bytes over the working directory (the launcher gave this
    process its own mount namespace): the program's disk use is capped, the host's disk never fills."""
    import ctypes
    opts = f"size={size},mode=0700" + ("" if uid is None else f",uid={uid},gid={uid}")
    if libc().mount(b"tmpfs", root.encode(), b"tmpfs", MS_NOSUID | MS_NODEV, opts.encode()) != 0:
        raise OSError(ctypes.get_errno(), "sandbox: could not mount the working directory's tmpfs")
    os.chdir(root)                          # the old cwd is the folder under the mount


def drop_privileges(uid):
    """Become `uid` (when the harness starts as real root), then give up every capability for
    good: root inside a user namespace keeps a full set across setresuid(0)."""
    c = libc()
    with open("/proc/sys/kernel/cap_last_cap") as f:
        last = int(f.read())
    # Bounding set and securebits need CAP_SETPCAP, so they come first; without it they fail
    # harmlessly (then there is nothing to drop).
    for cap in range(last + 1):
        c.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)
    c.prctl(PR_SET_SECUREBITS, SECURE_ALL, 0, 0, 0)
    if uid is not None:
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
    c.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    import ctypes
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)      # _LINUX_CAPABILITY_VERSION_3, this process
    c.capset(header, (ctypes.c_uint32 * 6)())          # effective, permitted, inheritable: none
    c.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    with open("/proc/self/status") as f:
        caps = {k: int(v, 16) for k, v in (line.split(":") for line in f if line.startswith("Cap"))}
    if caps["CapEff"] or caps["CapPrm"]:
        raise PermissionError(f"sandbox: could not drop the capabilities {caps}")


def set_dumpable(flag):
    """prctl(PR_SET_DUMPABLE): a non-dumpable process's memory and descriptors are closed to
    other processes without CAP_SYS_PTRACE (ptrace, /proc/<pid>/mem, /proc/<pid>/fd)."""
    libc().prctl(PR_SET_DUMPABLE, int(flag), 0, 0, 0)


def set_parent_death_signal():
    libc().prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0)


def print_exc():
    """The traceback being handled, to stderr. `traceback` (with `re`, `collections`, ...) is
    imported only when something failed: a passing run does not pay for its import."""
    import traceback
    traceback.print_exc()


def format_exc():
    import traceback
    return traceback.format_exc()


def program_process(source, cmd_r, reply_w, boot_r, cfg, parent):
    """The forked child: keep only its own descriptors, then run the untrusted program and serve
    calls until the pipe closes; in fallback mode in a fresh interpreter (`restart_clean`), which
    reads its code from `boot_r`."""
    set_parent_death_signal()
    if os.getppid() != parent:              # the harness died before the line above
        os._exit(1)
    if boot_r is None:
        stdin_from_devnull()                # stdin carried the program and will carry the nonce
    else:
        os.dup2(boot_r, 0)                  # the fresh interpreter's stdin
    keep = sorted({0, 1, 2, cmd_r, reply_w})
    for lo, hi in zip([-1] + keep, keep + [1 << 16]):
        if lo + 1 < hi:                     # closerange(n, n) closes everything on some Pythons
            os.closerange(lo + 1, hi)
    if cfg["guard"]:
        restart_clean(cmd_r, reply_w, cfg)
    serve(source, cmd_r, reply_w, cfg)


def stdin_from_devnull():
    devnull = os.open("/dev/null", os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)


def restart_clean(cmd_r, reply_w, cfg):
    """Fallback mode: exec a fresh interpreter for the program, never return. This fork of the
    harness holds modules that act below the audit hook: `ctypes`, loaded to drop privileges,
    stays reachable through `sys.modules` (and its types through `object.__subclasses__()`), and
    with it a program overwrote the guard's helper functions in memory and then wrote outside its
    working directory. The new interpreter (the harness's own command line, `-I -S -B`, with a
    config that says "serve") reads the harness's code and the program from a pipe on stdin, which
    the harness fills (`main`; a memfd would be a file, under RLIMIT_FSIZE), and installs the guard before the program's first line, with none of those modules loaded.

    RLIMIT_NPROC 0 (kept across exec): this process can start no other, not even a thread. The
    guard's list of refused modules holds only against `import`: `_imp.create_builtin` makes a
    module built into the interpreter (Debian's python3: `_posixsubprocess`) without an import
    event, and its `fork_exec` started a shell that no audit hook watches. The kernel's limit
    holds whatever the program calls (not for real root, which the fallback never runs it as
    where it can drop to a fresh uid)."""
    import resource                         # already loaded: set_limits
    resource.setrlimit(resource.RLIMIT_NPROC, (0, 0))
    os.set_inheritable(cmd_r, True)
    os.set_inheritable(reply_w, True)
    with open("/proc/self/cmdline", "rb") as f:     # python -I -S -B -c <bootstrap> <config> <mark>
        argv = f.read().split(b"\0")[:-1]
    argv[-2] = encode({"serve": [cmd_r, reply_w], "guard": True, "root": cfg["root"],  # noqa: F821
                       "block_net": cfg["block_net"], "max_entries": cfg["max_entries"]}).hex().encode()
    os.execv(sys.executable, argv)


def serve(source, cmd_r, reply_w, cfg):
    """Run the program as module `program` (under the guard in fallback mode), report the names it
    defines, then answer calls until the pipe closes."""
    if cfg["guard"]:
        install_guard(cfg["root"], cfg["block_net"], cfg["max_entries"])  # noqa: F821 (guard.py)
    apply_reference_rule()                  # noqa: F821 (reference.py): every mode, the same verdict
    mod = type(sys)("program")              # not __main__: a `__main__` block does not run
    mod.__file__ = "program.py"
    sys.modules["program"] = mod
    try:
        exec(compile(source, "program.py", "exec"), mod.__dict__)
        names = [k for k, v in mod.__dict__.items() if callable(v) and not k.startswith("__")]
    except BaseException:                   # SystemExit too: the program did not finish
        print_exc()
        sys.stderr.flush()
        os._exit(1)
    sys.stdout.flush()
    send(reply_w, {"names": names})         # noqa: F821 (wire.py)
    while True:
        try:
            msg = recv(cmd_r)               # noqa: F821 (wire.py)
        except EOFError:
            sys.stdout.flush()
            os._exit(0)
        try:
            fn = mod.__dict__[msg["call"]]
            reply = encode({"ok": fn(*msg["args"], **msg["kwargs"])})    # noqa: F821 (wire.py)
        except BaseException as e:          # noqa: BLE001 - reported to the judge, who fails
            if isinstance(e, SystemExit):
                os._exit(1)
            reply = encode({"err": format_exc()[-2000:]})                # noqa: F821 (wire.py)
        sys.stdout.flush()
        write_all(reply_w, frame(reply))    # noqa: F821 (wire.py)


class Remote:
    """A function of the program, called over the pipe; arguments and results are plain data."""

    def __init__(self, name, cmd_w, reply_r):
        self.__name__ = name
        self._cmd_w, self._reply_r = cmd_w, reply_r

    def __call__(self, *args, **kwargs):
        send(self._cmd_w, {"call": self.__name__, "args": list(args), "kwargs": kwargs})  # noqa: F821
        try:
            msg = recv(self._reply_r)       # noqa: F821 (wire.py)
        except EOFError:
            raise RuntimeError(f"the program exited during {self.__name__}()") from None
        if "err" in msg:                    # the program's own traceback, then the test's
            raise RuntimeError(f"{self.__name__}() raised, in the program:\n{msg['err']}")
        return msg["ok"]


def main():
    cfg = decode(bytes.fromhex(sys.argv[1]))                                 # noqa: F821 (wire.py)
    if "serve" in cfg:                      # the fallback's program process (`restart_clean`)
        source = read_exact(0, int.from_bytes(read_exact(0, 8), "big")).decode("utf-8")  # noqa: F821
        stdin_from_devnull()
        serve(source, *cfg["serve"], cfg)
    set_limits(cfg["limits"])
    if cfg["tmpfs"]:
        mount_tmpfs(cfg["root"], cfg["tmpfs"], cfg["uid"])
    drop_privileges(cfg["uid"])
    set_dumpable(False)                     # after the credential changes, which reset it
    if cfg.get("probe"):                    # isolation.probe: this launcher can do all of the above
        os._exit(0)
    source = read_exact(0, int.from_bytes(read_exact(0, 8), "big")).decode("utf-8", "replace")  # noqa: F821
    cmd_r, cmd_w = os.pipe()
    reply_r, reply_w = os.pipe()
    result_fd = cfg["result_fd"]
    me = os.getpid()
    boot_r, boot_w = os.pipe() if cfg["guard"] else (None, None)
    pid = os.fork()
    if pid == 0:
        os.close(cmd_w)
        os.close(reply_r)
        if boot_w is not None:
            os.close(boot_w)
        program_process(source, cmd_r, reply_w, boot_r, cfg, me)
        os._exit(1)
    os.close(cmd_r)
    os.close(reply_w)
    if boot_w is not None:                  # the fallback's fresh interpreter reads this first
        os.close(boot_r)
        try:
            write_all(boot_w, frame(HARNESS_CODE) + frame(source.encode("utf-8")))  # noqa: F821
        except OSError:                     # it died first: judged failed below
            pass
        os.close(boot_w)
    try:
        job = recv(0)                       # nonce, test, entry point, prompt: after the fork  # noqa: F821
        loaded = recv(reply_r)              # noqa: F821 (wire.py)
        if job["test"] is not None:
            ns = {"__name__": "judge"}
            if job["prompt"] is not None:   # the test's helpers, from the trusted prompt
                exec(compile(job["prompt"], "prompt.py", "exec"), ns)
            else:
                ns.update({n: Remote(n, cmd_w, reply_r) for n in loaded["names"]})
            candidate = Remote(job["entry_point"], cmd_w, reply_r)
            ns[job["entry_point"]] = candidate
            exec(compile(job["test"], "test.py", "exec"), ns)
            ns["check"](candidate)
    except BaseException as e:              # noqa: BLE001 - any failure is a failed run
        if not isinstance(e, EOFError):
            print_exc()
        else:
            print("judge: the program ended before it was checked", file=sys.stderr)
        sys.stderr.flush()
        os.kill(pid, 9)
        os.waitpid(pid, 0)                  # without a PID namespace nobody else would reap it
        os._exit(1)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    sys.stdout.flush()
    os.write(result_fd, job["nonce"].encode())
    os._exit(0)


if __name__ == "__main__":
    main()
