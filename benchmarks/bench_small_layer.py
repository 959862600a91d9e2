"""One small layer's capture: the whole-layer pass against the chunk loop and a plain forward.

`sinklens_attention` captures a layer of at most `SMALL_SCORES` scores in one pass
(`_capture_whole`: one matmul, one softmax, one batched matmul for every summed row set, one for
the output); a request with `query_chunk` set takes the chunk loop instead, whatever the size.
Each shape runs plain (no request), the whole pass, and the chunk loop with one chunk of all
queries, interleaved, with the masked / unmasked query groups of a traced DLM step, and again
with one key blocked per head (the masking's path). Batch 1, float32, one torch thread,
bidirectional, CPU process time per call (median of `--rounds` rounds of `--calls` calls).

    python benchmarks/bench_small_layer.py [--rounds 7] [--calls 400]
"""
from __future__ import annotations

import argparse
import os
import statistics
import time
import types

import torch

from sinklens.attention.function import sinklens_attention
from sinklens.attention.routes.exact_whole import SMALL_SCORES
from sinklens.attention.request import AttentionRequest

SHAPES = [(6, 34, 32), (8, 64, 64), (8, 128, 64), (8, 256, 64)]  # (heads, S, head dim); tiny-dlm is the first


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--calls", type=int, default=400)
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.set_grad_enabled(False)
    load = os.getloadavg()[0]
    print("| heads × S | scores ≤ SMALL_SCORES | plain µs | whole µs | chunk loop µs | whole / loop | "
          "blocked: whole µs | blocked: loop µs |")
    print("|---|---|---|---|---|---|---|---|")
    for h, s, d in SHAPES:
        g = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(1, h, s, d, generator=g) for _ in range(3))
        module = types.SimpleNamespace(num_key_value_groups=1, is_causal=False, layer_idx=0)
        groups = (torch.arange(s) >= s // 2).long()[None]
        blocked = torch.zeros(1, 1, h, s, dtype=torch.bool)
        blocked[0, 0, :, 1] = True

        def call(chunk=None, block=None, plain=False):
            req = None if plain else AttentionRequest(capture=True, query_groups=groups, num_groups=2,
                                                      query_chunk=chunk, blocked=block, route="exact")
            return lambda: sinklens_attention(module, q, k, v, None, scaling=d**-0.5, sinklens=req)

        runs = {"plain": call(plain=True), "whole": call(), "loop": call(chunk=s),
                "b_whole": call(block=blocked), "b_loop": call(chunk=s, block=blocked)}
        times = {name: [] for name in runs}
        for f in runs.values():
            for _ in range(args.calls // 10):
                f()
        for _ in range(args.rounds):
            for name, f in runs.items():
                t0 = time.process_time()
                for _ in range(args.calls):
                    f()
                times[name].append((time.process_time() - t0) / args.calls * 1e6)
        us = {name: statistics.median(t) for name, t in times.items()}
        print(f"| {h} × {s} | {'yes' if h * s * s <= SMALL_SCORES else 'no (loop either way)'} | {us['plain']:.1f} | "
              f"{us['whole']:.1f} | {us['loop']:.1f} | {us['whole'] / us['loop']:.2f}× | {us['b_whole']:.1f} | "
              f"{us['b_loop']:.1f} |")
    print(f"\nload average before / after: {load:.2f} / {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
