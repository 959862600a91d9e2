"""Peak memory and time of `sinklens report` on a LLaDA-8B-shaped synthetic trace.

The trace: --steps steps (default 128) of a 32-layer x 32-head model at S = 600, received
attention in float16 (--groups adds the masked / unmasked split: schema 2 then stores the two
groups and not their sum). Scores have a sink at position 0 and one that moves, so the
analysis has sinks to track (two per head and step, as in real traces: a few). The report runs in a fresh process through the CLI
(`python -m sinklens.cli report ... --quiet`); its peak RSS (ru_maxrss of the child, which
counts the memory-mapped trace pages it touched) is compared to the trace's size on disk,
and whether torch / transformers were imported is printed.

    PYTHONPATH=. python benchmarks/bench_report_memory.py --dir /tmp/bench_report

The child is `python -c ...`, whose sys.path starts with the current directory: run it from the
checkout you mean to measure (to measure another one, cd elsewhere and set PYTHONPATH to it).
"""
from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from sinklens.trace.writer import TraceWriter


def write_trace(path: Path, steps: int, layers: int, heads: int, seq: int, groups: bool) -> None:
    rng = np.random.default_rng(0)
    with TraceWriter(path, {"family": "llada", "sampler": {"name": "llada", "args": {"steps": steps}},
                            "query_groups": ["masked", "unmasked"] if groups else None}) as w:
        masked = np.ones(seq, bool)
        masked[:100] = False  # a 100-token prompt
        order = rng.permutation(np.arange(100, seq))
        for t in range(steps):
            base = rng.uniform(0.5, 1.5, (layers, heads, seq)).astype(np.float32)  # no false sinks
            base[:, :, 0] += 60.0  # a static sink
            base[:, :, 100 + t % (seq - 100)] += 25.0  # a moving one
            base *= seq / base.sum(-1, keepdims=True)
            kw = dict(received=base[None])
            if groups:
                share = rng.random((layers, heads, seq)).astype(np.float32)
                kw["received_groups"] = np.stack([base * share, base * (1 - share)])[None]
            masked[order[t * (seq - 100) // steps: (t + 1) * (seq - 100) // steps]] = False
            w.write_step(t, tokens=rng.integers(0, 1000, (1, seq)), is_masked=masked[None].copy(), **kw)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dir", default="/tmp/bench_report")
    p.add_argument("--steps", type=int, default=128)
    p.add_argument("--shape", type=int, nargs=3, default=[32, 32, 600], metavar=("L", "H", "S"))
    p.add_argument("--groups", action="store_true")
    p.add_argument("--figures", action="store_true", help="also draw the figures (default: --no-figures)")
    args = p.parse_args()
    out = Path(args.dir)
    out.mkdir(parents=True, exist_ok=True)
    trace = out / f"trace_{args.steps}_{'_'.join(map(str, args.shape))}{'_g' if args.groups else ''}.arrow"
    if not trace.exists():
        write_trace(trace, args.steps, *args.shape, groups=args.groups)
    size = trace.stat().st_size / 2**20
    probe = ("import sys, runpy; sys.argv = ['sinklens'] + sys.argv[1:]; from sinklens.cli import main; rc = main(); "
             "print('imported:', [m for m in ('torch', 'transformers') if m in sys.modules] or 'neither'); sys.exit(rc)")
    cmd = [sys.executable, "-c", probe, "report", str(trace), "--out", str(out / "report"), "--quiet"]
    if not args.figures:
        cmd.append("--no-figures")
    t = time.perf_counter()
    res = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    wall = time.perf_counter() - t
    if res.returncode:
        sys.exit(res.stderr[-2000:])
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024  # KB -> MB (Linux)
    print(res.stdout.strip().splitlines()[-1])
    print(f"trace {size:.1f} MB, report peak RSS {peak:.1f} MB = {peak / size:.2f}x the trace, {wall:.1f} s wall")


if __name__ == "__main__":
    main()
