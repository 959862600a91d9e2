"""Fallback mode only: an audit hook in the program's process (bubblewrap mode needs none).

Part of the harness's code (`harness.py` runs with this file in front of it): standard library
only, no sinklens import. What it refuses, and why each rule is shaped as it is:

- Writes, deletes, renames, chmod outside the working directory `root`. Paths are resolved by
  hand (`resolve`: /proc/self/fd and readlink, not os.path, which the program could
  monkey-patch). Calls whose audit event carries a `dir_fd` are resolved against it (-1 means
  "none"). The `open` event carries no `dir_fd`, so a relative path given to it must not climb
  above its own start (`..`): resolved against the working directory it could otherwise name one
  place while `os.open(rel, dir_fd=d)` writes another.
- Directories outside `root` cannot be opened at all (their descriptor would be a `dir_fd` for
  the *at() calls), and nothing under /proc/<pid>/ of another process (its memory, descriptors,
  environment: where the host's /proc is visible, the judge's own process is there).
- Disk use, where the working directory is not a size-capped tmpfs (`max_entries` set): at most
  that many files and folders in it (counted afresh on each create, so the program holds no
  counter it could reset); `harness.py` lowers RLIMIT_FSIZE to match.
- Every way to start a process, signals, links, UNIX-domain sockets (all sockets when there is
  no network namespace), ctypes and the modules that reach below the hook.

The hook uses no global name at call time (everything is bound as an immutable default
argument), and the judge's functions are compiled under their own file name `JUDGE_FILE`, whose
code and defaults the hook refuses to replace; so a program can neither rebind what the hook
relies on nor mutate it through a traceback's frame locals.
"""
import os
import sys

JUDGE_FILE = "<sinklens-judge>"     # the file name the judge's text is compiled under


def install_guard(root, block_net, max_entries=None):
    import posix
    import _socket                   # AF_UNIX only: `socket` itself would import `enum` and `selectors`

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
            base = _getcwd() if dir_fd is None or dir_fd < 0 else _readlink("/proc/self/fd/" + _str(dir_fd))
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

    def climbs(p, _fspath=posix.fspath, _type=type, _bytes=bytes, _int=int):
        """Does relative path `p` reach above its own start (`a/../..`)? Its base is unknown."""
        if _type(p) is _int:
            return False
        p = _fspath(p)
        if _type(p) is _bytes:
            p = p.decode("utf-8", "surrogateescape")
        if p.startswith("/"):
            return False
        depth = 0
        for name in p.split("/"):
            if name == "..":
                depth -= 1
                if depth < 0:
                    return True
            elif name not in ("", "."):
                depth += 1
        return False

    def entries(_root=root, _scandir=posix.scandir, _limit=max_entries):
        """Files and folders below the working directory, counting stops past the limit."""
        n, todo = 0, [_root]
        while todo and n <= _limit:
            with _scandir(todo.pop()) as it:
                for e in it:
                    n += 1
                    if e.is_dir(follow_symlinks=False):
                        todo.append(e.path)
        return n

    recent_pycs = []      # the last .pyc files opened outside `root` (imports): hints only

    def installed_pyc(data, _recent=recent_pycs, _resolve=resolve, _inside=inside, _open=posix.open,
                      _read=posix.read, _fstat=posix.fstat, _close=posix.close, _bytes=bytes,
                      _flags=os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, _fmt=0o170000, _reg=0o100000):
        """Is `data` (given to marshal.loads) the code of a .pyc file outside the working
        directory, i.e. what an import reads? The program cannot write there, so such code came
        from the compiler. The list of recent paths is reachable through a traceback's frame
        locals, so every path is checked here afresh, by its symlink-free name."""
        for p in _recent[::-1]:
            try:
                real = _resolve(p, None)
                if _inside(real) or not real.endswith(".pyc") or real.startswith(("/proc/", "/dev/")):
                    continue
                fd = _open(real, _flags)
                try:
                    st = _fstat(fd)
                    if st.st_mode & _fmt != _reg:
                        continue
                    chunks, left = [], st.st_size
                    while left > 0:
                        chunk = _read(fd, left)
                        if not chunk:
                            break
                        chunks.append(chunk)
                        left -= len(chunk)
                finally:
                    _close(fd)
            except (OSError, ValueError, TypeError):
                continue
            if _bytes(data) == b"".join(chunks)[16:]:     # after the 16-byte header
                return True
        return False

    own_proc = "/proc/" + str(os.getpid())
    # event -> ((path index, dir_fd index or None), ...): every path the call touches
    path_events = (
        ("os.remove", ((0, 1),)), ("os.rmdir", ((0, 1),)), ("os.mkdir", ((0, 2),)),
        ("os.rename", ((0, 2), (1, 3))), ("os.replace", ((0, 2), (1, 3))),
        ("os.chmod", ((0, 2),)), ("os.utime", ((0, 3),)), ("os.truncate", ((0, None),)),
        ("os.chflags", ((0, None),)), ("os.setxattr", ((0, None),)), ("os.removexattr", ((0, None),)),
        ("shutil.rmtree", ((0, None),)), ("shutil.move", ((0, None), (1, None))),
        ("shutil.copyfile", ((1, None),)), ("shutil.copytree", ((1, None),)),
    )
    denied = frozenset({
        "os.system", "os.exec", "os.posix_spawn", "os.spawn", "subprocess.Popen", "os.fork",
        "os.forkpty", "pty.spawn", "os.startfile", "os.kill", "os.killpg", "signal.pthread_kill",
        "os.pidfd_open", "os.link", "os.symlink", "os.chown", "shutil.chown", "os.mknod",
        "os.mkfifo", "os.lchflags", "os.setns", "os.unshare", "sys._current_frames",
        "os.putenv", "os.unsetenv",
        # code objects built by hand: bytecode is not checked, so LOAD_CONST past the end of
        # co_consts forged an object over all memory and the guard was rewritten from there
        "code.__new__", "marshal.load",
    })
    denied_modules = frozenset({
        "_posixsubprocess", "subprocess", "_multiprocessing", "multiprocessing", "_ctypes",
        "ctypes", "_xxsubinterpreters", "_xxinterpchannels", "_posixshmem", "pty",
        "_testcapi", "_testinternalcapi", "resource", "fcntl", "mmap",
    })
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
    dir_flags = getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_PATH", 0)
    func_internals = frozenset({"__code__", "__defaults__", "__kwdefaults__"})

    def guard(event, args, _inside=inside, _resolve=resolve, _climbs=climbs, _paths=path_events,
              _denied=denied, _mods=denied_modules, _wf=write_flags, _df=dir_flags,
              _creat=os.O_CREAT, _fi=func_internals, _judge=JUDGE_FILE, _block_net=block_net,
              _unix=_socket.AF_UNIX, _str=str, _bytes=bytes, _type=type, _int=int,
              _isdir=posix.stat, _err=PermissionError, _len=len, _fmt=0o170000, _dir=0o040000,
              _fn=type(resolve), _entries=entries, _limit=max_entries, _own=own_proc,
              _pycs=recent_pycs, _installed=installed_pyc, _rd=os.O_RDONLY):
        if event in _denied or event.startswith("ctypes."):
            raise _err("sandbox: " + event + " is not allowed")
        if event == "marshal.loads":        # code objects: only those the compiler wrote
            if not _installed(args[0]):
                raise _err("sandbox: marshal.loads of data that is no installed .pyc file")
            return
        if event == "import":
            if args[0] in _mods or args[0].split(".")[0] in _mods:
                raise _err("sandbox: importing " + args[0] + " is not allowed")
            return
        if event == "object.__setattr__":   # the judge's own functions stay as they are
            if _len(args) > 1 and args[1] in _fi and _type(args[0]) is _fn and \
                    args[0].__code__.co_filename == _judge:
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
        creates = event == "os.mkdir"
        if event == "open":
            path, flags = args[0], args[2]
            if path is None:
                return
            if _climbs(path):   # the event has no dir_fd: the base of a relative path is unknown
                raise _err("sandbox: a relative path that climbs above its start: " + _str(path))
            try:
                real = _resolve(path, None)
            except (OSError, ValueError, TypeError):
                real = ""
            if real.startswith("/proc/") and not (real == _own or real.startswith(_own + "/")) \
                    and real[6:].split("/")[0].isdigit():
                raise _err("sandbox: another process's /proc entry: " + _str(path))
            if not _inside(path):
                if flags is not None and flags & (_wf | _df):
                    raise _err("sandbox: opening outside the working directory for writing: " + _str(path))
                try:  # a directory outside would give a dir_fd for *at() calls: refuse it
                    is_dir = _type(path) is not _int and (_isdir(path).st_mode & _fmt) == _dir
                except (OSError, ValueError, TypeError):
                    is_dir = False
                if is_dir:
                    raise _err("sandbox: opening a directory outside the working directory")
                if _type(path) is _str and path.endswith(".pyc") and path not in _pycs:
                    _pycs.append(path)      # an import reading its code: see installed_pyc
                    del _pycs[:-4]
                return
            creates = flags is not None and flags & _creat
        for name, spec in _paths:
            if name == event:
                for i, j in spec:
                    if i < _len(args) and args[i] is not None:
                        dfd = args[j] if j is not None and j < _len(args) else None
                        if not _inside(args[i], dfd):
                            raise _err("sandbox: " + event + " outside the working directory")
                break
        if creates and _limit is not None and _entries() >= _limit:
            raise _err("sandbox: more than " + _str(_limit) + " files in the working directory")

    sys.addaudithook(guard)
