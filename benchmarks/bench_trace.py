"""What tracing and masking cost: whole generations plain, traced and sink-masked, side by side.

Models:
- `tiny-dlm` and `tiny-arm`, the shipped twins (1.9M parameters, S <= 34), each with its own
  sampler settings (`sinklens.experiments.twins`; the ARM without stop ids, so every mode makes the
  same 16 tokens), one generation on each of held-out problems 0-7 per run: here a step's
  forward is ~1-3 ms, so what tracing or masking adds per step (Python, the file) shows;
- `llada-27m`: a ~27M-parameter random Llama-shaped DLM (6 layers, d 512, 8 heads, vocab 8192),
  written as a LLaDA-format folder (official config keys and parameter names) and loaded with
  `sinklens.load`, so it travels the real path. Generation: 64-token prompt, gen_length 64,
  block_length 32, steps 64 (S = 128), low_confidence remasking, batch 1.

Modes: *plain* = `m.generate(...)`; *capture* = with a hook that asks for the attention and keeps
nothing (the capture pass alone, no file); *trace* = the same with `trace=` (the defaults of
`sinklens trace`: float16 received attention plus the masked/unmasked split); *mask* = with a
`SinkMaskingPolicy(MaskingConfig(mask_k=1))` hook (the top-1 sink per head blocked, as
`sinklens eval --mask-topk 1`), no trace, its record of what was blocked made after each
generation (`summary()`, as the eval does); *block* = a hook that blocks each head's key of the
largest unblocked received attention by one torch `argmax`, with none of the rule, the scope or the
record: what blocking costs the capture pass itself, the least any masking hook on this path pays.

- time: process CPU seconds per step (one torch thread: the work of this process, less sensitive to
  other jobs than wall time). A round is one generation in every mode of a model, back to back, in
  an order that rotates between rounds (the twins take their 8 prompts in turn); the table gives
  the median ms per step of plain and, per mode, the median of the rounds' own ratios to plain with
  its standard error (bootstrap over the rounds). A round's ratio compares times taken under one
  load: rounds of one generation (0.1-0.2 s a mode on a twin) give the host's load little time to
  move within one, and many of them (`--repeats`, default 96) make the median's error about ±0.01,
  where rounds of whole 8-prompt runs left ±0.08. The best times follow the table.
- trace bytes per step: size of the written trace / steps (the mean over the rounds).
- peak memory: each mode once more in a fresh subprocess, after one warm-up generation in
  the same mode: peak RSS (VmHWM) during the generation minus the RSS right before it (CPU has
  no allocator counters; the model's weights are not included). Measured twice: with glibc's
  default malloc (whose dynamic mmap threshold lets RSS grow with allocation patterns) and with
  a fixed mmap threshold, which shows the memory actually alive.

    python benchmarks/bench_trace.py [--repeats 96] [--large-repeats 5] [--threads 1] [--no-peaks] [--models ...]
    python benchmarks/bench_trace.py --calls    # Python calls per step of the twins (cProfile)
"""
from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import statistics
import subprocess
import sys
import tempfile
import time

import torch

import sinklens
from sinklens.attention.request import AttentionRequest
from sinklens.experiments.twins import LOAD, arm_sampler, dlm_sampler, heldout_prompt
from sinklens.masking.config import MaskingConfig
from sinklens.masking.policy import SinkMaskingPolicy
from sinklens.trace.writer import TraceWriter
from sinklens.train.model import ModelConfig, build_model, param_count, save_llada_folder

from common import beside_busy, cold_routine, machine, paired  # benchmarks/common.py, beside this script

CFG = ModelConfig(n_layers=6, d_model=512, n_heads=8, mlp_hidden=1376, vocab_size=8192, max_len=512)
MASK_ID, EOS_ID, PAD_ID = 8191, 8190, 8189
PROMPT, GEN, BLOCK, STEPS = 64, 64, 32, 64
MODES = ("plain", "capture", "trace", "mask", "block")
LARGE = "llada-27m"
TWIN_PROMPTS = 8
# glibc raises its mmap threshold after large frees, then keeps freed buffers in its heap: RSS
# then grows with allocation *patterns*, not with live memory. A fixed threshold shows live memory.
MALLOC = {"default": {}, "fixed": {"MALLOC_MMAP_THRESHOLD_": "131072"}}


def make_folder(folder: str) -> None:
    model = build_model(CFG, diffusion=True, seed=0)
    save_llada_folder(model, CFG, folder, mask_id=MASK_ID, eos_id=EOS_ID, pad_id=PAD_ID, dtype=torch.float32)


class Case:
    """One model with its prompt and sampler settings."""

    def __init__(self, name: str, model, prompts: list[torch.Tensor], settings: dict):
        self.name, self.model, self.prompts, self.settings = name, model, prompts, settings
        self.steps: dict[str, int] = {}  # mode -> steps of one run (all its prompts)


def twin_case(name: str) -> Case:
    """A twin on held-out problems 0-7, one generation each: one run is ~100 steps."""
    model = sinklens.load(name, **LOAD)
    prompts = [torch.tensor([model.apply_chat_template(heldout_prompt(i))]) for i in range(TWIN_PROMPTS)]
    # The ARM without stop ids: masking changes what it writes, and so where it would stop (mask
    # mode made 121 tokens where plain made 107); every mode now makes max_new_tokens, the same
    # work. (The DLM's steps are fixed by its settings.)
    return Case(name, model, prompts, dlm_sampler() if model.is_diffusion else dict(arm_sampler(), eos_token_id=[]))


def large_case(folder: str) -> Case:
    ids = torch.randint(0, MASK_ID - 3, (1, PROMPT), generator=torch.Generator().manual_seed(0))
    return Case(LARGE, sinklens.load(folder), [ids], dict(steps=STEPS, gen_length=GEN, block_length=BLOCK))


class Discard:
    """A hook that asks for the step's attention and keeps nothing: the capture pass alone."""

    wants_attention = True
    wants_commit_prob = False

    def after_step(self, event) -> None:
        pass


class BlockTop1:
    """A hook that blocks, at each step, every head's key of the largest unblocked received attention
    of the step before, by one `argmax`: none of the rule, the scope or the record (`block` mode)."""

    wants_attention = True
    wants_query_groups = False  # as the masking policy: no masked / unmasked split
    wants_commit_prob = False

    def __init__(self) -> None:
        self.top: torch.Tensor | None = None  # (L, B, H) the previous step's top key per head

    def before_step(self, step: int, tokens: torch.Tensor, is_masked: torch.Tensor) -> AttentionRequest:
        req = AttentionRequest(capture=True)
        if self.top is not None:
            req.blocked = torch.zeros(*self.top.shape, tokens.shape[1], dtype=torch.bool)   # (L, B, H, S)
            req.blocked.scatter_(-1, self.top[..., None], True)
        return req

    def after_step(self, event) -> None:
        self.top = event.attention.received_unblocked.argmax(-1)


def run(case: Case, mode: str, out_dir: str, one_group: bool = False, prompts: list[int] | None = None
        ) -> tuple[float, int, int]:
    """One generation per prompt of the case (`prompts`: these indices only); returns (process CPU
    seconds, trace bytes, steps). one_group: the trace writer holds a generation's steps for one write
    whatever the time they take (`--calls`: a profiler slows the steps past the writer's one-second
    flush, which would add groups)."""
    m = case.model
    seconds, nbytes, steps = 0.0, 0, 0
    for i in range(len(case.prompts)) if prompts is None else prompts:
        ids = case.prompts[i]
        path = os.path.join(out_dir, f"{case.name}-{mode}-{i}.arrow") if mode == "trace" else None
        hook = SinkMaskingPolicy(MaskingConfig(mask_k=1), num_layers=m.num_layers, is_diffusion=m.is_diffusion,
                                 model=m) if mode == "mask" else Discard() if mode == "capture" \
            else BlockTop1() if mode == "block" else None
        t0 = time.process_time()
        trace = TraceWriter(path, flush_seconds=float("inf")) if path and one_group else path
        out = m.generate(ids, trace=trace, hook=hook, **case.settings)
        if trace is not path:
            trace.close()
        if mode == "mask":
            hook.summary()  # what was blocked, as an eval records it per sample (counted in batches: stats.py)
        seconds += time.process_time() - t0
        steps += out.num_steps
        if path:
            nbytes += os.path.getsize(path)
            # a user writes a new file: overwriting one costs this file system 2-4 ms for the truncate
            os.remove(path)
    key = mode if prompts is None else (mode, tuple(prompts))
    if case.steps.setdefault(key, steps) != steps:
        raise RuntimeError(f"{case.name} {mode}: {steps} steps, {case.steps[key]} in an earlier round")
    return seconds, nbytes, steps


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
    case = large_case(folder)
    with tempfile.TemporaryDirectory() as tmp:
        # one whole generation in the same mode first (thread pools, first-call caches, the C
        # allocator's retained arenas), so the figure is what one more generation needs
        run(case, mode, tmp)
        before = vm_kb("VmRSS")
        run(case, mode, tmp)
        print(json.dumps({"peak_mb": (vm_kb("VmHWM") - before) / 1024}))


def calls_per_step(threads: int) -> None:
    """`--calls`: Python calls per step (cProfile's count, which the machine's load does not move) of
    plain, trace and mask on the twins, one run of each after a warm-up run."""
    torch.set_num_threads(threads)
    torch.set_grad_enabled(False)
    print("| model | plain calls / step | trace | mask | trace over plain | mask over plain |")
    print("|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for name in ("tiny-dlm", "tiny-arm"):
            case, calls = twin_case(name), {}
            for mode in ("plain", "trace", "mask"):
                run(case, mode, tmp, one_group=True)  # warm-up: first-call caches, the kernel's build
                prof = cProfile.Profile()
                prof.enable()
                run(case, mode, tmp, one_group=True)
                prof.disable()
                calls[mode] = pstats.Stats(prof).total_calls / case.steps[mode]
            print(f"| {name} | {calls['plain']:.0f} | {calls['trace']:.0f} | {calls['mask']:.0f} | "
                  f"+{calls['trace'] - calls['plain']:.0f} | +{calls['mask'] - calls['plain']:.0f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=96, help="rounds on each twin (a round: one generation per mode)")
    ap.add_argument("--large-repeats", type=int, default=5, help=f"rounds on {LARGE}")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--no-peaks", dest="peaks", action="store_false", help="skip the peak-memory subprocesses")
    ap.add_argument("--_peak", nargs=2, metavar=("FOLDER", "MODE"), help=argparse.SUPPRESS)
    ap.add_argument("--calls", action="store_true", help="only the Python calls per step of the twins (cProfile)")
    ap.add_argument("--models", nargs="+", choices=("tiny-dlm", "tiny-arm", LARGE), default=None,
                    help="which models (default: all three)")
    ap.add_argument("--beside-busy", action="store_true", help="run beside a second process spinning on one core")
    args = ap.parse_args()
    if args.calls:
        return calls_per_step(args.threads)
    if args._peak:
        return peak_child(*args._peak, args.threads)

    torch.set_num_threads(args.threads)
    torch.set_grad_enabled(False)
    load = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp, beside_busy(args.beside_busy):
        folder = os.path.join(tmp, "bench-llada")
        make_folder(folder)
        names = args.models or ["tiny-dlm", "tiny-arm", LARGE]
        cases = [large_case(folder) if n == LARGE else twin_case(n) for n in names]
        for case in cases:
            for mode in MODES:
                run(case, mode, tmp, prompts=[0])  # warm-up
        rounds = {c.name: args.large_repeats if c.name == LARGE else args.repeats for c in cases}
        per_step = {(c.name, m): [] for c in cases for m in MODES}  # CPU seconds per step, one entry per round
        steps, size = {}, {}
        for r in range(max(rounds.values())):
            for case in cases:
                if r >= rounds[case.name]:
                    continue
                # a round: one generation (the twins' prompts in turn) in every mode, back to back, in an
                # order that rotates from round to round, so that a round's ratios compare times taken
                # under one load; rounds this short (0.1-0.2 s a mode on a twin) leave the host's load
                # little time to move within one
                which = [r % len(case.prompts)]
                for mode in MODES[r % len(MODES):] + MODES[:r % len(MODES)]:
                    seconds, nbytes, n = run(case, mode, tmp, prompts=which)
                    per_step[case.name, mode].append(seconds / n)
                    steps.setdefault(case.name, set()).add(n)
                    size[case.name] = size.get(case.name, 0) + nbytes / n
        colds = [(c, cold_routine(c.model, c.prompts[0])) for c in cases]   # after the rounds: under their load
        peaks = {}  # (mode, malloc setting) -> MB, the large model
        for mode in ("plain", "trace") if args.peaks else ():
            for label, env in MALLOC.items():
                res = subprocess.run([sys.executable, __file__, "--threads", str(args.threads), "--_peak", folder, mode],
                                     capture_output=True, text=True, check=True, env={**os.environ, **env})
                peaks[mode, label] = json.loads(res.stdout.strip().splitlines()[-1])["peak_mb"]

    about = []
    if LARGE in rounds:
        about.append(f"{LARGE}: LLaDA-format random DLM, {param_count(CFG) / 1e6:.1f}M parameters ({CFG.n_layers} "
                     f"layers x {CFG.n_heads} heads, d {CFG.d_model}, vocab {CFG.vocab_size}); prompt {PROMPT} + gen "
                     f"{GEN} (S = {PROMPT + GEN}), block {BLOCK}, {STEPS} steps, batch 1.")
    if any(n != LARGE for n in rounds):
        about.append(f"Twins: held-out problems 0-{TWIN_PROMPTS - 1} in turn, their own sampler settings.")
    print(machine())
    print("cold caches: " + "; ".join(f"{c.name}: {cold}" for c, cold in colds))
    print(" ".join(about) + f" {args.threads} thread(s); rounds: " + ", ".join(f"{c.name} {rounds[c.name]}" for c in cases)
          + f"; process CPU time; load average before / after: {load[0]:.2f} / {os.getloadavg()[0]:.2f}\n")
    print("| model | steps / generation | plain ms/step | capture / plain | trace / plain | mask / plain | "
          "block / plain | trace bytes / step |")
    print("|---|---|---|---|---|---|---|---|")
    for case in cases:
        name = case.name
        ratio = {m: paired(per_step[name, m], per_step[name, "plain"]) for m in MODES}
        print(f"| {name} | {'/'.join(str(n) for n in sorted(steps[name]))} | "
              f"{1e3 * statistics.median(per_step[name, 'plain']):.2f} | {ratio['capture']} | {ratio['trace']} | "
              f"{ratio['mask']} | {ratio['block']} | {size[name] / rounds[name] / 1e3:.1f} kB |")
    if peaks:
        print(f"\n{LARGE}, peak RSS growth of one generation (MB): "
              + ", ".join(f"{mode} {peaks[mode, 'default']:.1f} (default malloc) / {peaks[mode, 'fixed']:.1f} "
                          f"(MALLOC_MMAP_THRESHOLD_=128 KiB)" for mode in ("plain", "trace")))
    print("\nbest ms/step: " + ", ".join(f"{c.name} {m} {1e3 * min(per_step[c.name, m]):.2f}" for c in cases
                                       for m in MODES))


if __name__ == "__main__":
    main()
