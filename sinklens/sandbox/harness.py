"""The judge's harness: the trusted program that runs *inside* the sandbox (stdlib only).

`sinklens.eval.sandbox` starts it as `python -I -S -c <this file's text> <config json>`; it is
never imported by sinklens itself. Two processes, so that a pass can be proven:

    harness (trusted)                          program (untrusted, forked before any secret exists)
    ---------------------------------------    ------------------------------------------------
    read the program from stdin
    fork ------------------------------------> close stdin and every other descriptor,
                                               install the guard (fallback mode), exec the program
    read nonce + test from stdin               report the names it defines  (or die trying)
    exec the prompt + test, call               answer calls: candidate(*args) -> plain data
      check(candidate) over the pipe  <------>
    kill the program; write the nonce
    on the result descriptor; exit 0

Why each piece:
- The nonce is read only after the fork, by the harness alone, which is non-dumpable (no
  /proc/<pid>/mem or ptrace by a same-uid process), so the program cannot learn it; only the
  harness can write it, and only after `check` returned. `sys.exit(0)`, `os._exit(0)`, atexit
  hooks or `SystemExit` at import therefore end the *program*, which the harness sees as a
  broken pipe: judged failed.
- Values cross the pipe as tagged JSON of exact builtin types (`encode`/`decode`), never pickle
  and never the program's own objects, so an object whose `__eq__` always answers True, or a
  str subclass, cannot reach the test.
- The test's helpers (HumanEval 32's `poly`, 38's `encode_cyclic`) come from the trusted prompt
  executed here, not from the completion, which could redefine them.
"""
import json
import os
import sys

# ---------------------------------------------------------------------------------------------
# Plain data across the pipe (exact builtin types only).


def encode(v, depth=0):
    if depth > 100:
        raise ValueError("value nested deeper than 100 levels")
    t = type(v)
    if v is None or t is bool or t is int or t is str:
        return v
    if t is float:
        return v if v == v and v not in (float("inf"), float("-inf")) else {"f": repr(v)}
    if t is list:
        return [encode(x, depth + 1) for x in v]
    if t is tuple:
        return {"t": [encode(x, depth + 1) for x in v]}
    if t is dict:
        return {"d": [[encode(k, depth + 1), encode(x, depth + 1)] for k, x in v.items()]}
    if t is set or t is frozenset:
        return {"s" if t is set else "fs": [encode(x, depth + 1) for x in v]}
    if t is bytes:
        return {"b": v.hex()}
    if t is complex:
        return {"c": [v.real, v.imag]}
    raise TypeError(f"cannot pass a {t.__module__}.{t.__qualname__} between judge and program")


def decode(v):
    if type(v) is list:
        return [decode(x) for x in v]
    if type(v) is not dict:
        return v
    (tag, x), = v.items()
    if tag == "f":
        return float(x)
    if tag == "t":
        return tuple(decode(e) for e in x)
    if tag == "d":
        return {decode(k): decode(e) for k, e in x}
    if tag == "s":
        return {decode(e) for e in x}
    if tag == "fs":
        return frozenset(decode(e) for e in x)
    if tag == "b":
        return bytes.fromhex(x)
    if tag == "c":
        return complex(*x)
    raise ValueError(f"unknown tag {tag!r}")


def send(fd, obj):
    data = json.dumps(obj).encode()
    data = len(data).to_bytes(8, "big") + data
    while data:
        data = data[os.write(fd, data):]


def read_exact(fd, n):
    chunks = []
    while n:
        b = os.read(fd, min(n, 1 << 20))     # never more than asked: nothing of the next frame
        if not b:
            raise EOFError("the other side closed the pipe")
        chunks.append(b)
        n -= len(b)
    return b"".join(chunks)


def recv(fd):
    return json.loads(read_exact(fd, int.from_bytes(read_exact(fd, 8), "big")))


# ---------------------------------------------------------------------------------------------
# Fallback mode only: an audit hook in the program's process (bubblewrap mode needs none).
# It uses no global name at call time (everything is bound as a default argument, and
# `object.__setattr__` on function internals is refused), so the program cannot rebind what it
# relies on (its functions' code and defaults, compiled from "<string>", cannot be replaced);
# paths are resolved by hand from /proc/self/fd and readlink, not by os.path, which
# the program could monkey-patch.


def install_guard(root, block_net):
    import posix
    import socket as _socket_mod     # noqa: F401  (imported now so the program need not)

    def resolve(p, dir_fd, _readlink=posix.readlink, _lstat=posix.lstat, _getcwd=posix.getcwd,
                _str=str, _bytes=bytes, _int=int, _type=type, _islnk=0o120000, _fmt=0o170000,
                _fspath=posix.fspath):
        """Absolute, symlink-free path of `p` (relative to `dir_fd` when given)."""
        if _type(p) is _int:
            return _readlink("/proc/self/fd/" + _str(p))
        p = _fspath(p)
        if _type(p) is _bytes:
            p = p.decode("utf-8", "surrogateescape")
        if not p.startswith("/"):
            base = _getcwd() if dir_fd is None else _readlink("/proc/self/fd/" + _str(dir_fd))
            p = base + "/" + p
        parts, out, hops = p.split("/"), [], 0
        while parts:
            name = parts.pop(0)
            if name in ("", "."):
                continue
            if name == "..":
                if out:
                    out.pop()
                continue
            cand = "/" + "/".join(out + [name])
            try:
                is_link = (_lstat(cand).st_mode & _fmt) == _islnk
            except OSError:
                is_link = False
            if is_link:
                hops += 1
                if hops > 40:
                    raise PermissionError("sandbox: too many symbolic links")
                target = _readlink(cand)
                if target.startswith("/"):
                    out = []
                parts = target.split("/") + parts
            else:
                out.append(name)
        return "/" + "/".join(out)

    def inside(p, dir_fd=None, _root=root, _resolve=resolve):
        try:
            r = _resolve(p, dir_fd)
        except (OSError, ValueError, TypeError):
            return False
        return r == _root or r.startswith(_root + "/")

    # event -> ((path index, dir_fd index or None), ...): every path the call touches
    path_events = {
        "os.remove": ((0, 1),), "os.rmdir": ((0, 1),), "os.mkdir": ((0, 2),),
        "os.rename": ((0, 2), (1, 3)), "os.replace": ((0, 2), (1, 3)),
        "os.chmod": ((0, 2),), "os.utime": ((0, 3),), "os.truncate": ((0, None),),
        "os.chflags": ((0, None),), "os.setxattr": ((0, None),), "os.removexattr": ((0, None),),
        "shutil.rmtree": ((0, None),), "shutil.move": ((0, None), (1, None)),
        "shutil.copyfile": ((1, None),), "shutil.copytree": ((1, None),),
    }
    denied = frozenset({
        "os.system", "os.exec", "os.posix_spawn", "os.spawn", "subprocess.Popen", "os.fork",
        "os.forkpty", "pty.spawn", "os.startfile", "os.kill", "os.killpg", "signal.pthread_kill",
        "os.pidfd_open", "os.link", "os.symlink", "os.chown", "shutil.chown", "os.mknod",
        "os.mkfifo", "os.lchflags", "os.setns", "os.unshare", "sys._current_frames",
        "os.putenv", "os.unsetenv",
    })
    denied_modules = frozenset({
        "_posixsubprocess", "subprocess", "_multiprocessing", "multiprocessing", "_ctypes",
        "ctypes", "_xxsubinterpreters", "_xxinterpchannels", "_posixshmem", "pty",
        "_testcapi", "_testinternalcapi", "resource", "fcntl", "mmap",
    })
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
    dir_flags = getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_PATH", 0)
    func_internals = frozenset({"__code__", "__defaults__", "__kwdefaults__"})

    def guard(event, args, _inside=inside, _paths=path_events, _denied=denied,
              _mods=denied_modules, _wf=write_flags, _df=dir_flags, _fi=func_internals,
              _block_net=block_net, _unix=_socket_mod.AF_UNIX, _str=str, _bytes=bytes,
              _type=type, _int=int, _isdir=posix.stat, _err=PermissionError, _len=len,
              _fmt=0o170000, _dir=0o040000, _fn=type(resolve)):
        if event in _denied or event.startswith("ctypes."):
            raise _err("sandbox: " + event + " is not allowed")
        if event == "import":
            if args[0] in _mods or args[0].split(".")[0] in _mods:
                raise _err("sandbox: importing " + args[0] + " is not allowed")
            return
        if event == "object.__setattr__":   # the guard's own functions stay as they are
            if _len(args) > 1 and args[1] in _fi and _type(args[0]) is _fn and \
                    args[0].__code__.co_filename == "<string>":
                raise _err("sandbox: changing the judge's " + args[1] + " is not allowed")
            return
        if event.startswith("socket."):
            if _block_net:
                raise _err("sandbox: network (" + event + ") is not allowed")
            if event == "socket.__new__" and args[1] == _unix:
                raise _err("sandbox: UNIX-domain sockets are not allowed")
            if event in ("socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg") and \
                    _len(args) > 1 and _type(args[1]) in (_str, _bytes):
                raise _err("sandbox: UNIX-domain addresses are not allowed")
            return
        if event == "open":
            path, flags = args[0], args[2]
            if path is None or _inside(path):
                return
            if flags is not None and flags & (_wf | _df):
                raise _err("sandbox: opening outside the working directory for writing: " + _str(path))
            try:      # a directory outside would give a dir_fd for *at() calls: refuse it
                is_dir = _type(path) is not _int and (_isdir(path).st_mode & _fmt) == _dir
            except (OSError, ValueError, TypeError):
                is_dir = False
            if is_dir:
                raise _err("sandbox: opening a directory outside the working directory")
            return
        spec = _paths.get(event)
        if spec:
            for i, j in spec:
                if i < _len(args) and args[i] is not None:
                    dfd = args[j] if j is not None and j < _len(args) else None
                    if not _inside(args[i], dfd):
                        raise _err("sandbox: " + event + " outside the working directory")

    sys.addaudithook(guard)


# ---------------------------------------------------------------------------------------------
# The two processes.


def set_dumpable(flag):
    """prctl(PR_SET_DUMPABLE): a non-dumpable process's memory and descriptors are closed to
    other processes of the same user (ptrace, /proc/<pid>/mem, /proc/<pid>/fd)."""
    import ctypes
    ctypes.CDLL(None, use_errno=True).prctl(4, int(flag), 0, 0, 0)


def set_parent_death_signal():
    import ctypes
    import signal
    ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL), 0, 0, 0)


def program_process(source, cmd_r, reply_w, cfg, parent):
    """The forked child: run the untrusted program, then serve calls until the pipe closes."""
    set_parent_death_signal()
    if os.getppid() != parent:              # the harness died before the line above
        os._exit(1)
    devnull = os.open("/dev/null", os.O_RDONLY)
    os.dup2(devnull, 0)                     # stdin carried the program and will carry the nonce
    keep = sorted({0, 1, 2, cmd_r, reply_w})
    for lo, hi in zip([-1] + keep, keep + [1 << 16]):
        if lo + 1 < hi:                     # closerange(n, n) closes everything on some Pythons
            os.closerange(lo + 1, hi)
    sys.stdin = open(0, closefd=False)
    if cfg["guard"]:
        install_guard(cfg["root"], cfg["block_net"])
    import types
    mod = types.ModuleType("program")       # not __main__: a `__main__` block does not run
    mod.__file__ = "program.py"
    sys.modules["program"] = mod
    try:
        exec(compile(source, "program.py", "exec"), mod.__dict__)
        names = [k for k, v in mod.__dict__.items() if callable(v) and not k.startswith("__")]
    except BaseException:                   # SystemExit too: the program did not finish
        import traceback
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)
    sys.stdout.flush()
    send(reply_w, {"names": names})
    while True:
        try:
            msg = recv(cmd_r)
        except EOFError:
            sys.stdout.flush()
            os._exit(0)
        try:
            fn = mod.__dict__[msg["call"]]
            out = {"ok": encode(fn(*decode(msg["args"]), **decode(msg["kwargs"])))}
        except BaseException as e:          # noqa: BLE001 - reported to the judge, who fails
            if isinstance(e, SystemExit):
                os._exit(1)
            out = {"err": f"{type(e).__name__}: {e}"[:2000]}
        sys.stdout.flush()
        send(reply_w, out)


class Remote:
    """A function of the program, called over the pipe; arguments and results are plain data."""

    def __init__(self, name, cmd_w, reply_r):
        self.__name__ = name
        self._cmd_w, self._reply_r = cmd_w, reply_r

    def __call__(self, *args, **kwargs):
        send(self._cmd_w, {"call": self.__name__, "args": encode(list(args)),
                           "kwargs": encode(kwargs)})
        try:
            msg = recv(self._reply_r)
        except EOFError:
            raise RuntimeError(f"the program exited during {self.__name__}()") from None
        if "err" in msg:
            raise RuntimeError(f"{self.__name__}() raised {msg['err']}")
        return decode(msg["ok"])


def main():
    cfg = json.loads(sys.argv[1])
    set_dumpable(False)
    source = read_exact(0, int.from_bytes(read_exact(0, 8), "big")).decode("utf-8", "replace")
    cmd_r, cmd_w = os.pipe()
    reply_r, reply_w = os.pipe()
    result_fd = cfg["result_fd"]
    me = os.getpid()
    pid = os.fork()
    if pid == 0:
        os.close(cmd_w)
        os.close(reply_r)
        program_process(source, cmd_r, reply_w, cfg, me)
        os._exit(1)
    os.close(cmd_r)
    os.close(reply_w)
    try:
        job = recv(0)                       # nonce, test, entry point, prompt: after the fork
        loaded = recv(reply_r)
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
            import traceback
            traceback.print_exc()
        else:
            print("judge: the program ended before it was checked", file=sys.stderr)
        sys.stderr.flush()
        os.kill(pid, 9)
        os._exit(1)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    sys.stdout.flush()
    os.write(result_fd, job["nonce"].encode())
    os._exit(0)


if __name__ == "__main__":
    main()
