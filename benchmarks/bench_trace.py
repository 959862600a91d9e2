"""What tracing costs: a 64-step LLaDA generation with and without trace capture, side by side.

The model: a ~30M-parameter random Llama-shaped DLM (6 layers, d 512, 8 heads, vocab 8192),
written as a LLaDA-format folder (official config keys and parameter names) and loaded with
`sinklens.load`, so it travels the real path. Generation: 64-token prompt, gen_length 64,
block_length 32, steps 64 (S = 128), low_confidence remasking, batch 1.

- time: the two modes alternate `--repeats` times in this process (machine load hits both
  alike); the table gives the median and the best run, the ratio is of the medians.
- trace bytes per step: size of the written trace / steps (float16 received + the
  masked/unmasked split, i.e. the defaults of `sinklens trace`).
- peak memory: each mode once more in a fresh subprocess, after one warm-up generation in
  the same mode: peak RSS (VmHWM) during the generation minus the RSS right before it (CPU has
  no allocator counters; the model's weights are not included). Measured twice: with glibc's
  default malloc (whose dynamic mmap threshold lets RSS grow with allocation patterns) and with
  a fixed mmap threshold, which shows the memory actually alive.

    python benchmarks/bench_trace.py [--repeats 3] [--threads 1]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch

import sinklens
from sinklens.train.model import ModelConfig, build_model, param_count, save_llada_folder

CFG = ModelConfig(n_layers=6, d_model=512, n_heads=8, mlp_hidden=1376, vocab_size=8192, max_len=512)
MASK_ID, EOS_ID, PAD_ID = 8191, 8190, 8189
PROMPT, GEN, BLOCK, STEPS = 64, 64, 32, 64
MODES = ("plain", "trace")
# glibc raises its mmap threshold after large frees, then keeps freed buffers in its heap: RSS
# then grows with allocation *patterns*, not with live memory. A fixed threshold shows live memory.
MALLOC = {"default": {}, "fixed": {"MALLOC_MMAP_THRESHOLD_": "131072"}}


def make_folder(folder: str) -> None:
    model = build_model(CFG, diffusion=True, seed=0)
    save_llada_folder(model, CFG, folder, mask_id=MASK_ID, eos_id=EOS_ID, pad_id=PAD_ID, dtype=torch.float32)


def run(model, mode: str, out_dir: str) -> tuple[float, int]:
    """One generation; returns (seconds, trace bytes)."""
    ids = torch.randint(0, MASK_ID - 3, (1, PROMPT), generator=torch.Generator().manual_seed(0))
    path = os.path.join(out_dir, f"{mode}.arrow") if mode == "trace" else None
    t0 = time.perf_counter()
    out = model.generate(ids, steps=STEPS, gen_length=GEN, block_length=BLOCK, trace=path)
    seconds = time.perf_counter() - t0
    assert out.sequences.shape == (1, PROMPT + GEN)
    return seconds, (os.path.getsize(path) if path else 0)


def vm_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


def peak_child(folder: str, mode: str, threads: int) -> None:
    """Subprocess entry: peak RSS growth (MB) of one generation in `mode`, printed as JSON."""
    torch.set_num_threads(threads)
    torch.set_grad_enabled(False)
    model = sinklens.load(folder)
    with tempfile.TemporaryDirectory() as tmp:
        # one whole generation in the same mode first (thread pools, first-call caches, the C
        # allocator's retained arenas), so the figure is what one more generation needs
        run(model, mode, tmp)
        before = vm_kb("VmRSS")
        run(model, mode, tmp)
        print(json.dumps({"peak_mb": (vm_kb("VmHWM") - before) / 1024}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--_peak", nargs=2, metavar=("FOLDER", "MODE"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args._peak:
        return peak_child(*args._peak, args.threads)

    torch.set_num_threads(args.threads)
    torch.set_grad_enabled(False)
    with tempfile.TemporaryDirectory() as tmp:
        folder = os.path.join(tmp, "bench-llada")
        make_folder(folder)
        model = sinklens.load(folder)
        run(model, "plain", tmp)  # warm-up
        times = {m: [] for m in MODES}
        size = 0
        for _ in range(args.repeats):
            for mode in MODES:
                seconds, nbytes = run(model, mode, tmp)
                times[mode].append(seconds)
                size = nbytes or size
        peaks = {}  # (mode, malloc setting) -> MB
        for mode in MODES:
            for label, env in MALLOC.items():
                res = subprocess.run([sys.executable, __file__, "--threads", str(args.threads), "--_peak", folder, mode],
                                     capture_output=True, text=True, check=True, env={**os.environ, **env})
                peaks[mode, label] = json.loads(res.stdout.strip().splitlines()[-1])["peak_mb"]

    med = {m: statistics.median(times[m]) for m in MODES}
    print(f"model: LLaDA-format random DLM, {param_count(CFG) / 1e6:.1f}M parameters "
          f"({CFG.n_layers} layers x {CFG.n_heads} heads, d {CFG.d_model}, vocab {CFG.vocab_size}); "
          f"prompt {PROMPT} + gen {GEN} (S = {PROMPT + GEN}), block {BLOCK}, {STEPS} steps, batch 1, "
          f"{args.threads} thread(s), {args.repeats} alternating repeats\n")
    print("| mode | median total (s) | best (s) | per step (ms) | trace bytes / step | peak RSS growth (MB), "
          "default malloc | peak RSS growth (MB), MALLOC_MMAP_THRESHOLD_=128 KiB |")
    print("|---|---|---|---|---|---|---|")
    for mode in MODES:
        per_step = f"{size / STEPS / 1e3:.1f} kB" if mode == "trace" else "-"
        print(f"| {mode} | {med[mode]:.2f} | {min(times[mode]):.2f} | {1e3 * med[mode] / STEPS:.1f} | {per_step} | "
              f"{peaks[mode, 'default']:.1f} | {peaks[mode, 'fixed']:.1f} |")
    print(f"\ntrace / plain time ratio (medians): {med['trace'] / med['plain']:.3f}  (target <= 1.3)")


if __name__ == "__main__":
    main()
