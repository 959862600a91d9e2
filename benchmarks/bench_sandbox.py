"""HumanEval judge throughput: the 164 canonical solutions, side by side in one run.

    .venv/bin/python -m benchmarks.bench_sandbox [--workers 2] [--repeat 1]

Routes, each over the same 164 (program, test) pairs with `workers` at a time:
- bwrap     the judge in bubblewrap (the default where bubblewrap works)
- fallback  the judge in its fallback mode (unshare + audit hook)
- bare      a bare `python -I -S -c program+test+check` subprocess: no sandbox, no proof (what
            "exit code 0" judging costs; the floor the sandbox is compared with)
Prints programs/s per route and the ratio to bare. Target: >= 25 programs/s on 2 workers.
"""
from __future__ import annotations

import argparse
import subprocess
import time
import warnings
from concurrent.futures import ThreadPoolExecutor

from sinklens.eval import humaneval
from sinklens.sandbox import SandboxConfig, probe, run_checks
from sinklens.sandbox.isolation import _interpreter


def _bare(jobs: list[dict], workers: int) -> list[bool]:
    python = _interpreter(False)

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
    routes = {"bare": lambda: _bare(jobs, args.workers)}
    for mode in ("bwrap", "fallback"):
        try:
            probe(mode)
        except RuntimeError as e:
            print(f"{mode}: unavailable ({e})")
            continue
        routes[mode] = (lambda m: lambda: [r.passed for r in
                                           run_checks(jobs, SandboxConfig(mode=m), args.workers)])(mode)
    took = {name: 0.0 for name in routes}
    passed = {}
    for _ in range(args.repeat):
        for name, fn in routes.items():
            t0 = time.perf_counter()
            passed[name] = sum(fn())
            took[name] += time.perf_counter() - t0
    n = len(jobs) * args.repeat
    print(f"{len(jobs)} canonical HumanEval programs x {args.repeat}, {args.workers} workers")
    print(f"{'route':10s} {'passed':>7s} {'prog/s':>8s} {'x bare':>7s}")
    for name in routes:
        print(f"{name:10s} {passed[name]:>4d}/{len(jobs)} {n / took[name]:8.1f} {took[name] / took['bare']:7.2f}")


if __name__ == "__main__":
    main()
