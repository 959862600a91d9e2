"""What `sinklens eval --attention-stats` costs: wall time of the same eval with and without it.

tiny-dlm (the shipped twin) on arith, rows K = 0 and K = 1 with its random control, the model
loaded once, runs interleaved in one process (off, on, off, on, ...) into fresh folders, so
machine load hits both; plus the bytes of a row's corpus file per sample.

    PYTHONPATH=. python benchmarks/bench_eval_corpus.py --dir /tmp/bench_eval_corpus
"""
from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", required=True, help="scratch folder for the eval outputs")
    ap.add_argument("--limit", type=int, default=6, help="samples per row")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()

    import torch

    from sinklens.eval.runner import EvalConfig, run_eval
    from sinklens.models.loader import load

    torch.set_num_threads(1)
    m = load("tiny-dlm", dtype="float32")
    root = Path(args.dir)

    def once(tag: str, stats: bool) -> tuple[float, list[str]]:
        cfg = EvalConfig(model="tiny-dlm", task="arith", out=str(root / tag), limit=args.limit, mask_topk=(0, 1),
                         mask_control="random", loglik=False, progress=False, attention_stats=stats)
        t0 = time.perf_counter()
        dirs = run_eval(cfg, model=m)
        return time.perf_counter() - t0, dirs

    once("warmup", True)
    times = {False: [], True: []}
    for r in range(args.rounds):
        for stats in (False, True):
            wall, dirs = once(f"r{r}_{'on' if stats else 'off'}", stats)
            times[stats].append(wall)
            print(f"round {r}: attention stats {'on ' if stats else 'off'}: {wall:6.2f} s", flush=True)
    ratios = [on / off for on, off in zip(times[True], times[False])]
    size = os.path.getsize(os.path.join(dirs[0], "corpus", "corpus.jsonl"))
    print(f"median off {statistics.median(times[False]):.2f} s, on {statistics.median(times[True]):.2f} s; "
          f"ratio on/off per round {', '.join(f'{x:.2f}' for x in ratios)} (median {statistics.median(ratios):.2f}x); "
          f"load average {os.getloadavg()[0]:.1f}; corpus.jsonl of the K=0 row: {size / args.limit / 1024:.1f} kB "
          "per sample")


if __name__ == "__main__":
    main()
