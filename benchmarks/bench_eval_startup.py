"""What one `sinklens eval` process costs before its first sample, and what a second process buys.

1. Start-up: a fresh interpreter that imports what `sinklens eval --task arith` imports
   (`sinklens.eval.runner`) and loads `tiny-dlm` (1.9M parameters), beside two floors measured
   the same way: `import torch` alone, and torch + transformers' model classes
   (`transformers.PreTrainedModel`, which every model sinklens loads is). Wall seconds from
   spawning the process to its exit, and its peak RSS (VmHWM). Variants interleaved, median of
   `--repeats`.
2. Throughput: `sinklens eval --model tiny-dlm --task arith --limit N` (default 50, unmasked)
   as one process and as 2 (`python -m torch.distributed.run --standalone --nproc_per_node 2`,
   what `torchrun` runs); wall seconds of the whole command, each into a fresh output folder,
   interleaved, median of `--repeats`.

    python benchmarks/bench_eval_startup.py [--repeats 3] [--limit 50]
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

CHILD = {
    "import torch": "import torch",
    "torch + transformers models": "import torch; from transformers import PreTrainedModel",
    "sinklens eval imports + load tiny-dlm": ("import sinklens.eval.runner; from sinklens.models.loader import load; "
                                             "load('tiny-dlm', dtype='float32')"),
}
REPORT = ("import sys; print('RESULT', open('/proc/self/status').read().split('VmHWM:')[1].split()[0], "
          "len([m for m in sys.modules if m.startswith('sinklens')]))")


def startup(code: str) -> tuple[float, float, int]:
    """(wall seconds, peak RSS MB, sinklens modules) of a fresh interpreter running `code`."""
    t0 = time.perf_counter()
    res = subprocess.run([sys.executable, "-c", f"{code}\n{REPORT}"], capture_output=True, text=True, check=True)
    seconds = time.perf_counter() - t0
    line = next(l for l in res.stdout.splitlines() if l.startswith("RESULT"))
    _, kb, n = line.split()
    return seconds, int(kb) / 1024, int(n)


def eval_run(procs: int, limit: int, out: str) -> float:
    cmd = [sys.executable, "-m", "sinklens.cli", "eval", "--model", "tiny-dlm", "--task", "arith",
           "--limit", str(limit), "--out", out, "-q"]
    if procs > 1:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(procs)] + cmd[1:]
    t0 = time.perf_counter()
    subprocess.run(cmd, capture_output=True, text=True, check=True)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--limit", type=int, default=50, help="arith samples per eval run")
    ap.add_argument("--no-eval", dest="eval", action="store_false", help="start-up only")
    args = ap.parse_args()
    load = os.getloadavg()[0]

    starts = {name: [] for name in CHILD}
    for _ in range(args.repeats):
        for name, code in CHILD.items():
            starts[name].append(startup(code))
    runs = {1: [], 2: []}
    if args.eval:
        with tempfile.TemporaryDirectory() as tmp:
            for r in range(args.repeats):
                for procs in runs:
                    runs[procs].append(eval_run(procs, args.limit, os.path.join(tmp, f"p{procs}-{r}")))

    print(f"{os.cpu_count()} CPUs, load average before / after: {load:.2f} / {os.getloadavg()[0]:.2f}; "
          f"{args.repeats} repeats, medians\n")
    print("| process | start-up s | peak RSS MB | sinklens modules |")
    print("|---|---|---|---|")
    for name, rows in starts.items():
        print(f"| {name} | {statistics.median(r[0] for r in rows):.2f} | {statistics.median(r[1] for r in rows):.0f} | "
              f"{rows[0][2]} |")
    if args.eval:
        one, two = statistics.median(runs[1]), statistics.median(runs[2])
        print(f"\n`sinklens eval --model tiny-dlm --task arith --limit {args.limit}`: 1 process {one:.2f} s, "
              f"2 processes {two:.2f} s: {one / two:.2f}x")


if __name__ == "__main__":
    main()
