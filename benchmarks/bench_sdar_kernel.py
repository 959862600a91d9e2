"""What SDAR's masked forwards cost on sdpa's math backend, against the fused kernel.

sinklens runs SDAR forwards that mask a key (the prefill, `forward_logits`) on sdpa's math
backend, because the official code lands there (`official_kernel` in sinklens/models/sdar.py);
its denoising steps mask nothing and keep the fused kernel. This times one plain forward of the
SDAR-shaped random Qwen3 of bench_capture.py under the block-causal mask (blocks of 4, SDAR's),
fused vs math, interleaved in one process, best of --repeats, process CPU time, one thread.

    PYTHONPATH=. python benchmarks/bench_sdar_kernel.py --seqs 512 1024 --dtypes float32 bfloat16
"""
from __future__ import annotations

import argparse
import os
import time
from contextlib import nullcontext

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

import sinklens.attention as sa
from benchmarks.bench_capture import block_causal, random_qwen3


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seqs", type=int, nargs="+", default=[512, 1024])
    ap.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    ap.add_argument("--block", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(1)
    sa.register()
    print(f"load average before: {os.getloadavg()[0]:.2f}")
    print("| dtype | S | fused s | math s | math / fused |\n|---|---|---|---|---|")
    for dtype in args.dtypes:
        model = random_qwen3(causal=False).to(getattr(torch, dtype))
        for s in args.seqs:
            ids = torch.randint(0, 8192, (1, s), generator=torch.Generator().manual_seed(s))
            mask = block_causal(s, args.block)
            best = {"fused": float("inf"), "math": float("inf")}
            for _ in range(args.repeats):
                for kind in best:  # interleaved, so load hits both alike
                    with torch.no_grad(), sdpa_kernel([SDPBackend.MATH]) if kind == "math" else nullcontext():
                        t = time.process_time()
                        model(ids, attention_mask=mask, position_ids=torch.arange(s)[None], use_cache=False)
                        best[kind] = min(best[kind], time.process_time() - t)
            print(f"| {dtype} | {s} | {best['fused']:.3f} | {best['math']:.3f} | {best['math'] / best['fused']:.2f}× |")
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
