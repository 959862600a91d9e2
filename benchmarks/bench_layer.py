"""One attention layer: sdpa (plain) against the compiled route's capture, by how it makes its products.

SmolLM2-135M's attention shape (9 query heads on 3 key heads, D 64; `--bidirectional`: 8 heads on 8,
every row seeing every key), batch 1, float32, random q / k / v laid out as a model hands them (views
of (B, S, heads, D)). Modes: *sdpa* = `sinklens_attention` without a request (transformers' sdpa);
*packed* = the compiled route capturing received attention with its register-blocked products over
keys packed once per head, in tiles of `compiled.packed_rows` rows (the default for these head
sizes), or of each height given with `--tiles`; *blas* = the same route with its products through
BLAS in tiles of `compiled.tile_rows` (the path for head sizes that are not multiples of 16).
One thread, process CPU time per call; a round calls every mode once in an order that rotates; the
table gives each mode's best time and the median of its rounds' ratios to sdpa ± its standard error.

    PYTHONPATH=. python benchmarks/bench_layer.py [--seqs 512 1024 2048 4096] [--rounds 7] [--tiles 24 96]
"""
from __future__ import annotations

import argparse
import time
import types

import torch

from sinklens.attention.function import sinklens_attention
from sinklens.attention.request import AttentionRequest
from sinklens.attention.routes import build, compiled

from common import beside_busy, machine, paired  # benchmarks/common.py, beside this script


def inputs(s: int, heads: int, kv_heads: int, d: int = 64):
    """q (1, H, S, D), k and v (1, H_kv, S, D) as views of (1, S, heads, D), as a model's projections."""
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, s, heads, d, generator=g).transpose(1, 2)
    k, v = (torch.randn(1, s, kv_heads, d, generator=g).transpose(1, 2) for _ in range(2))
    return q, k, v


def call(mode: str, module, q, k, v, causal: bool, monkey: dict) -> float:
    """CPU seconds of one layer's call in `mode` (sdpa, blas, packed or packed@ROWS)."""
    compiled.PANEL, compiled.packed_rows = monkey["panel"], monkey["rows"]
    req = None
    if mode != "sdpa":
        req = AttentionRequest(capture=True, route="compiled")
        if mode == "blas":
            compiled.PANEL = 1 << 30                       # no head size is a multiple: BLAS
        elif "@" in mode:
            rows = int(mode.split("@")[1])
            compiled.packed_rows = lambda s_k, every_key=False: rows   # noqa: E731  (this height instead)
    t = time.process_time()
    sinklens_attention(module, q, k, v, None, scaling=q.shape[-1] ** -0.5, is_causal=causal, sinklens=req)
    dt = time.process_time() - t
    compiled.PANEL, compiled.packed_rows = monkey["panel"], monkey["rows"]
    return dt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seqs", type=int, nargs="+", default=[512, 1024, 2048, 4096])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--tiles", type=int, nargs="*", default=[], help="packed tile heights to time besides the default")
    ap.add_argument("--bidirectional", action="store_true", help="8 heads on 8, every row sees every key")
    ap.add_argument("--beside-busy", action="store_true", help="run beside a second process spinning on one core")
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.set_grad_enabled(False)
    if build.load() is None:
        raise SystemExit(f"the compiled kernel is unavailable here: {build.reason()}")
    heads, kv_heads, causal = (8, 8, False) if args.bidirectional else (9, 3, True)
    module = types.SimpleNamespace(layer_idx=0, is_causal=causal, num_key_value_groups=heads // kv_heads,
                                   training=False)
    monkey = {"panel": compiled.PANEL, "rows": compiled.packed_rows}
    modes = ["sdpa", "packed", *[f"packed@{t}" for t in args.tiles], "blas"]
    with beside_busy(args.beside_busy):
        print(machine())
        print(f"{'bidirectional 8 / 8' if args.bidirectional else 'causal 9 / 3'} heads, D 64, one thread, "
              f"{args.rounds} rounds; ratios: median of the rounds' own ± its standard error (range)\n")
        print("| S | " + " | ".join(f"{m} ms (best)" for m in modes) + " | "
              + " | ".join(f"{m} / sdpa" for m in modes[1:]) + " |")
        print("|---" * (2 * len(modes)) + "|")
        for s in args.seqs:
            q, k, v = inputs(s, heads, kv_heads)
            times = {m: [] for m in modes}
            for m in modes:   # one call each first: the library, the buffers
                call(m, module, q, k, v, causal, monkey)
            for r in range(args.rounds):
                for m in modes[r % len(modes):] + modes[:r % len(modes)]:
                    times[m].append(call(m, module, q, k, v, causal, monkey))
            label = {"packed": f"packed ({compiled.packed_rows(s, args.bidirectional)} rows)"}
            print(f"| {s} | " + " | ".join(f"{min(times[m]) * 1e3:.1f}" for m in modes) + " | "
                  + " | ".join(f"{label.get(m, m)} {paired(times[m], times['sdpa'])}" for m in modes[1:]) + " |",
                  flush=True)


if __name__ == "__main__":
    main()
