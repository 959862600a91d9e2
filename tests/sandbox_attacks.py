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
import sys
import zlib

TEST = "def check(c):\n    assert c(1) == 2\n    assert c(41) == 42\n"
WRONG = "\ndef f(x):\n    return 0\n"
DISK = 8 << 20          # the sandbox's disk (tmpfs size) in these runs
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


def nap(token: str) -> str:
    """How long the attacks' daemons sleep: 31337 s and a fraction naming the test run, so that a
    check for leftover processes counts this run's only, not a parallel run's."""
    return f"31337.{zlib.crc32(token.encode())}"


def cases(d: str, port: int, unix_path: str, abstract: str, token: str) -> dict[str, dict]:
    """name -> run_check job. `d` holds keep.txt (0o666) and sub/inner.txt, in a 0o777 directory,
    so that file permissions alone would not stop these attacks: only the sandbox does."""
    def attack(code: str, then: str = WRONG) -> dict:
        return {"program": "import os, sys\ntry:\n" + "".join(f"    {line}\n" for line in code.splitlines())
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
        "kill the harness": exits("import os, signal\ndef f(x):\n    os.kill(os.getppid(), signal.SIGKILL)\n"),
        "kill everything, exit 0": exits("import os\ndef f(x):\n    os.kill(-1, 9)\n    os._exit(0)\n"),
        "fake proofs on every fd": exits(
            "import os\ndef f(x):\n    for fd in range(3, 1024):\n        try:\n"
            "            os.write(fd, b'0' * 32)\n        except OSError:\n            pass\n"
            "    os._exit(0)\n"),
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
        # inspect and dataclasses (namedtuple compiles functions from a string)
        "right (control)": {"program": "import os, tempfile, inspect, dataclasses\n"
                            "open('scratch.txt', 'w').write('ok')\nos.mkdir('d')\nos.mkdir('d/e')\n"
                            "os.rename('scratch.txt', 'd/s.txt')\nos.remove('d/s.txt')\nos.rmdir('d/e')\n"
                            "open(os.path.join(tempfile.gettempdir(), 'scratch'), 'w').write('ok')\n"
                            "with tempfile.TemporaryDirectory() as t:\n    open(os.path.join(t, 'x'), 'w').write('ok')\n"
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
    sb = load_sandbox(repo)
    jobs = cases(d, int(port), unix_path, abstract, token)
    cfg = sb.SandboxConfig(mode=mode, timeout=4.0, cpu_seconds=3, memory_bytes=512 << 20,
                           file_bytes=1 << 20, max_processes=16, tmpfs_bytes=DISK, max_files=8)
    results = sb.run_checks(list(jobs.values()), cfg, workers=2)
    print(json.dumps({name: r.to_dict() for name, r in zip(jobs, results)}))
