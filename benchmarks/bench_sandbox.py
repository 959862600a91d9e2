"""HumanEval judge throughput: the 164 canonical solutions, side by side in one run.

    .venv/bin/python -m benchmarks.bench_sandbox [--workers 2] [--repeat 1]

Routes, each over the same 164 (program, test) pairs with `workers` at a time:
- bwrap     the judge in bubblewrap (the default where bubblewrap works)
- fallback  the judge in its fallback mode (unshare + audit hook)
- bare      a bare `python -I -S -c program+test+check` subprocess of this interpreter: no
            sandbox, no proof (what "exit code 0" judging costs; the floor the sandbox is compared with)
- bare-sandbox-python   the same with the interpreter the sandbox runs, where that is another one
            (as root with a private interpreter: the system's, which any uid can run)
Prints the load average, programs/s per route and the ratio to bare. Targets: >= 25 programs/s on
2 workers; the sandbox at most 2.5x bare.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import time
import warnings
from concurrent.futures import ThreadPoolExecutor

from sinklens.eval import humaneval
from sinklens.sandbox import SandboxConfig, probe, run_checks
from sinklens.sandbox.isolation import _interpreter


def _bare(jobs: list[dict], workers: int, python: str) -> list[bool]:
    def one(job):
        src = f"{job['program']}\n\n{job['test']}\n\ncheck({job['entry_point']})\n"
        return subprocess.run([python, "-I", "-S", "-c", src], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, timeout=30).returncode == 0
    with ThreadPoolExecutor(workers) as pool:
        return list(pool.map(one, jobs))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=1, help="rounds; routes interleaved in each")
    args = ap.parse_args()
    warnings.simplefilter("ignore", RuntimeWarning)         # the fallback's once-per-run notice
    problems, _ = humaneval.load()
    jobs = [humaneval.check_job(p, humaneval.extract_code(p["canonical_solution"], p)) for p in problems]
    own = _interpreter(False)
    routes = {"bare": lambda: _bare(jobs, args.workers, own)}
    pythons = {"bare": own}
    for mode in ("bwrap", "fallback"):
        try:
            probe(mode)
        except RuntimeError as e:
            print(f"{mode}: unavailable ({e})")
            continue
        routes[mode] = (lambda m: lambda: [r.passed for r in
                                           run_checks(jobs, SandboxConfig(mode=m), args.workers)])(mode)
        pythons[mode] = probe(mode).python
    inside = pythons.get("bwrap") or pythons.get("fallback")
    if inside and inside != own:
        routes["bare-sandbox-python"] = lambda: _bare(jobs, args.workers, inside)
        pythons["bare-sandbox-python"] = inside
    load = os.getloadavg()[0]
    took = {name: 0.0 for name in routes}
    passed = {}
    for _ in range(args.repeat):
        for name, fn in routes.items():
            t0 = time.perf_counter()
            passed[name] = sum(fn())
            took[name] += time.perf_counter() - t0
    n = len(jobs) * args.repeat
    print(f"{len(jobs)} canonical HumanEval programs x {args.repeat}, {args.workers} workers, "
          f"load average {load:.2f} before and {os.getloadavg()[0]:.2f} after")
    print(f"{'route':20s} {'passed':>7s} {'prog/s':>8s} {'x bare':>7s}  interpreter")
    for name in routes:
        print(f"{name:20s} {passed[name]:>4d}/{len(jobs)} {n / took[name]:8.1f} "
              f"{took[name] / took['bare']:7.2f}  {pythons[name]}")


if __name__ == "__main__":
    main()
