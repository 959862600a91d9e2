"""Where one sandboxed HumanEval check spends its CPU time: each layer of the bubblewrap route alone.

    .venv/bin/python -m benchmarks.bench_sandbox_layers [--repeat 20]      (as root)

CPU time of a command and everything it starts (bwrap's children in their own PID namespace
included, which no rusage of ours sees) is read from a cgroup made for this run and removed
after it, so it needs a writable cgroup (cgroup v1 `cpuacct` or v2): root, usually. Wall-clock
time on a shared machine mostly measures the other jobs; CPU time much less so. Layers,
interleaved, median per command:

- bare         `python -I -S -c program+test+check` (this interpreter, and the sandbox's)
- python       the sandbox's interpreter doing nothing, and importing what the harness imports
- setpriv      the drop to a fresh uid (as root only)
- bwrap        + bubblewrap with the sandbox's namespaces and mounts, running `true`, then python
- run_check    the whole judge (bwrap and fallback mode), the judge's own process included
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import warnings

from sinklens.sandbox import SandboxConfig, probe, run_check
from sinklens.sandbox.isolation import _interpreter, drop_to

PROGRAM = "def f(x):\n    return x + 1\n"
TEST = "def check(c):\n    assert c(1) == 2\n"
CGROUPS = ("/sys/fs/cgroup/cpuacct", "/sys/fs/cgroup/unified", "/sys/fs/cgroup")


class CpuMeter:
    """CPU milliseconds used by this process and all it starts, from a cgroup of its own."""

    def __init__(self):
        for root in CGROUPS:
            path = os.path.join(root, f"sinklens-bench-{os.getpid()}")
            try:
                os.mkdir(path)
            except OSError:
                continue
            self.root, self.path = root, path
            self.v1 = os.path.exists(os.path.join(path, "cpuacct.usage"))
            if self.v1 or os.path.exists(os.path.join(path, "cpu.stat")):
                with open(os.path.join(path, "cgroup.procs"), "w") as f:
                    f.write(str(os.getpid()))
                return
            os.rmdir(path)
        raise SystemExit("bench_sandbox_layers: needs a writable cgroup (cgroup v1 cpuacct or v2) "
                         "to count the CPU time of bwrap's children: run it as root")

    def ms(self) -> float:
        if self.v1:
            with open(os.path.join(self.path, "cpuacct.usage")) as f:
                return int(f.read()) / 1e6
        with open(os.path.join(self.path, "cpu.stat")) as f:
            return int(dict(line.split() for line in f)["usage_usec"]) / 1e3

    def close(self) -> None:
        with open(os.path.join(self.root, "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))
        os.rmdir(self.path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=20, help="rounds; layers interleaved in each")
    args = ap.parse_args()
    warnings.simplefilter("ignore", RuntimeWarning)         # the fallback's once-per-run notice
    iso = probe("bwrap")
    py, own = iso.python, _interpreter(False)
    drop = drop_to(2_000_123) if iso.uid == "fresh" else []

    def run(cmd):
        subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    bare = PROGRAM + TEST + "check(f)\n"
    layers = {
        "bare, this interpreter": lambda: run([own, "-I", "-S", "-c", bare]),
        "bare, the sandbox's interpreter": lambda: run([py, "-I", "-S", "-c", bare]),
        "python -I -S -c pass": lambda: run([py, "-I", "-S", "-c", "pass"]),
        "python: import os, resource, ctypes": lambda: run([py, "-I", "-S", "-c", "import os, resource, ctypes"]),
        "python: import json, traceback": lambda: run([py, "-I", "-S", "-c", "import json, traceback"]),
        "setpriv true": lambda: run(drop + ["/usr/bin/true"]),
        "setpriv + bwrap true": lambda: run(drop + list(iso.launcher) + ["/usr/bin/true"]),
        "setpriv + bwrap python pass": lambda: run(drop + list(iso.launcher) + [py, "-I", "-S", "-c", "pass"]),
        "run_check, bwrap": lambda: run_check(PROGRAM, TEST, "f", config=SandboxConfig(mode="bwrap")),
        "run_check, fallback": lambda: run_check(PROGRAM, TEST, "f", config=SandboxConfig(mode="fallback")),
    }
    meter = CpuMeter()
    try:
        layers["run_check, bwrap"]()                        # probe and compile outside the count
        layers["run_check, fallback"]()
        used = {name: [] for name in layers}
        load = os.getloadavg()[0]
        for _ in range(args.repeat):
            for name, fn in layers.items():
                t0 = meter.ms()
                fn()
                used[name].append(meter.ms() - t0)
    finally:
        meter.close()
    print(f"CPU ms per command, median of {args.repeat}, load average {load:.2f} before and "
          f"{os.getloadavg()[0]:.2f} after ({sys.version.split()[0]} here)")
    for name, v in used.items():
        print(f"{name:36s} {statistics.median(v):6.1f}")


if __name__ == "__main__":
    main()
