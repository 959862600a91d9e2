"""Capture mode vs plain sdpa vs the eager `output_attentions` route, side by side.

A ~30M-parameter Llama-shaped model, bidirectional, batch 1, S = 256, 512, 1024. For each S:
- plain:   sinklens attention with no request (= transformers' sdpa)
- capture: sinklens attention capturing received attention of every layer and head
- eager:   transformers eager attention with output_attentions=True, then column sums
Time = best of N forward passes (interleaved, so machine load hits all three alike).
Peak memory = peak RSS of a fresh subprocess during one forward (sampled every 0.5 ms by a
thread, glibc's mmap threshold fixed so RSS tracks live memory), minus its RSS just before
that forward (CPU has no allocator counters like CUDA's).
"attention-only" = that peak minus the plain forward's peak (what capturing adds; the logits,
(S x 8192) fp32, and the MLP activations are common to every mode).

    python benchmarks/bench_attention.py            # prints a markdown table
"""
from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import threading
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

import sinklens.attention as sa

MODES = ("plain", "capture", "eager")


def build_model() -> LlamaForCausalLM:
    cfg = LlamaConfig(vocab_size=8192, hidden_size=512, intermediate_size=1376, num_hidden_layers=6,
                      num_attention_heads=8, num_key_value_heads=8, max_position_embeddings=2048)
    cfg.is_causal = False
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg).eval()


def forward(model, mode: str, ids: torch.Tensor) -> torch.Tensor:
    """One forward in `mode`; returns the (L, B, H, S) received attention (or the logits for plain)."""
    if mode == "plain":
        model.config._attn_implementation = sa.ATTENTION_NAME
        return model(ids).logits
    if mode == "capture":
        model.config._attn_implementation = sa.ATTENTION_NAME
        req = sa.AttentionRequest(capture=True)
        model(ids, sinklens=req)
        return req.received
    model.config._attn_implementation = "eager"
    out = model(ids, output_attentions=True)
    return torch.stack([a.sum(2) for a in out.attentions])


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def measure_peak(mode: str, seq: int) -> float:
    """In this (fresh) process: RSS growth during one forward, in MB."""
    torch.set_grad_enabled(False)
    model = build_model()
    ids = torch.randint(0, 8192, (1, seq))
    forward(model, "plain", ids[:, :8])  # allocations common to every mode
    return peak_growth(lambda: forward(model, mode, ids))


def peak_growth(fn) -> float:
    """RSS growth in MB during fn(), sampled every 0.5 ms by a thread (never time such a call:
    the thread's CPU time counts in the process's)."""
    base, peak, done = rss_mb(), [0.0], threading.Event()

    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], rss_mb())
            time.sleep(0.0005)

    t = threading.Thread(target=sample)
    t.start()
    try:
        fn()
    finally:
        done.set()
        t.join()
    return max(peak[0], rss_mb()) - base


def peak_rss_mb(mode: str, seq: int) -> float:
    """Run `measure_peak` in a fresh subprocess, so no mode inherits another's freed memory."""
    code = "import sys; sys.path.insert(0, '.'); from benchmarks.bench_attention import measure_peak; print(measure_peak(%r, %d))" % (mode, seq)
    # A fixed mmap threshold makes glibc return large freed buffers at once, so RSS follows
    # live memory instead of the allocator's retention (which depends on allocation patterns).
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "131072"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    return float(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seq", default="256,512,1024")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.set_grad_enabled(False)
    model = build_model()
    n_params = sum(p.numel() for p in model.parameters()) / 1e6
    print(f"model: {n_params:.1f}M parameters, 6 layers x 8 heads, bidirectional, fp32, {args.threads} threads\n")
    print("| S | plain s | capture s | eager+colsum s | capture/plain | eager/capture (time) "
          "| peak MB plain | capture | eager | eager/capture (memory) | attention-only MB capture | eager "
          "| eager/capture (attention memory) | max abs diff capture vs eager |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for seq in (int(s) for s in args.seq.split(",")):
        ids = torch.randint(0, 8192, (1, seq), generator=torch.Generator().manual_seed(seq))
        best = {m: float("inf") for m in MODES}
        for m in MODES:
            forward(model, m, ids)  # warm-up
        for _ in range(args.repeats):
            for m in MODES:
                t0 = time.perf_counter()
                forward(model, m, ids)
                best[m] = min(best[m], time.perf_counter() - t0)
        diff = (forward(model, "capture", ids) - forward(model, "eager", ids)).abs().max().item()
        mem = {m: peak_rss_mb(m, seq) for m in MODES}
        print(f"| {seq} | {best['plain']:.3f} | {best['capture']:.3f} | {best['eager']:.3f} "
              f"| {best['capture'] / best['plain']:.2f}x | {best['eager'] / best['capture']:.2f}x "
              f"| {mem['plain']:.0f} | {mem['capture']:.0f} | {mem['eager']:.0f} "
              f"| {mem['eager'] / max(mem['capture'], 1):.1f}x "
              f"| {mem['capture'] - mem['plain']:.0f} | {mem['eager'] - mem['plain']:.0f} "
              f"| {(mem['eager'] - mem['plain']) / max(mem['capture'] - mem['plain'], 1):.0f}x | {diff:.1e} |", flush=True)


if __name__ == "__main__":
    main()
