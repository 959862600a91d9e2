"""One part of a twin's step switched on and off between generations in one process: what it adds a step.

Whole runs of `bench_trace.py` move by ±0.02-0.03 from run to run on a shared machine, more than a
part of ~50 µs in a 5 ms step. Here every round is two generations of one held-out problem
(problems 0-7 in turn), the part on in one and off in the other, in an order that alternates
between rounds; the table gives the median of the rounds' paired differences (on − off, µs per step)
± its standard error (a bootstrap over the rounds). Process CPU time, one torch thread; `--model`
tiny-arm (default) or tiny-dlm.

Parts:
- `kernel-selection`: sink-masked generations (`MaskingConfig(mask_k=1)`), the masking's default
  selection through the compiled kernel (`select._compiled_top1`) against its numpy path;
- `numpy-ops`: plain generations with a hook that runs `--ops` small numpy operations after each
  step (runs of the same three kinds: argmax, zeros, a product) against the same hook running none:
  what a kind of operation costs inside a generation, where the model's weights between two steps
  have pushed its code and data out of the caches (its first run) and what a further run costs;
- `sampler-probs`: traced generations (a new file each, `sinklens trace`'s defaults), each step's
  commit probabilities made again from its logits (on) against read from the probabilities the
  sampler ranked on (`Steps.step(probs=...)`, LLaDA's low-confidence remasking: off);
- `trace-writer`: traced generations, the trace writer (on) against a writer that opens the file
  and keeps nothing (off): what holding and writing the steps costs in all.
- `flat-columns`: traced generations, a group's columns whose steps differ in shape (an ARM's
  growing canvas) joined in torch into one tensor each (`arrays._flat`, on) against converted step
  by step in numpy (off).

    PYTHONPATH=. python benchmarks/bench_step_switch.py --part kernel-selection [--rounds 600]
    PYTHONPATH=. python benchmarks/bench_step_switch.py --part numpy-ops --ops 30 [--rounds 200]
    PYTHONPATH=. python benchmarks/bench_step_switch.py --part sampler-probs --model tiny-dlm --rounds 300
    PYTHONPATH=. python benchmarks/bench_step_switch.py --part trace-writer --model tiny-arm --rounds 300
    PYTHONPATH=. python benchmarks/bench_step_switch.py --part flat-columns --model tiny-arm --rounds 300
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time

import numpy as np
import torch

import sinklens.samplers.steps as steps_module
import sinklens.trace.writer as writer_module
from sinklens.masking import select
from sinklens.masking.config import MaskingConfig
from sinklens.masking.policy import SinkMaskingPolicy

from bench_trace import twin_case  # benchmarks/, beside this script
from common import cold_routine, machine, paired


class NumpyOps:
    """A hook that runs `n` small numpy operations after each step (runs of three kinds)."""

    wants_attention = False
    wants_commit_prob = False

    def __init__(self, n: int) -> None:
        self.n = n
        self.a = np.random.default_rng(0).random((4, 1, 4, 30)).astype(np.float32)

    def after_step(self, event) -> None:
        for _ in range(self.n // 3):
            self.a.argmax(-1)
            np.zeros(self.a.shape, bool)
            self.a * 1.5


class KeepNothing(writer_module.TraceWriter):
    """A trace writer that opens its file and keeps nothing (`trace-writer` off)."""

    def after_step(self, event) -> None:
        pass

    def close(self) -> None:
        self._sink.close()
        self.closed = True


def switch(part: str, ops: int, folder: str):
    """(the generation's keyword arguments with the part on or off, restore) for `part`."""
    if part == "kernel-selection":
        fast = select._compiled_top1

        def turn(on: bool) -> None:
            select._compiled_top1 = fast if on else (lambda *args: None)

        def kwargs(m, on: bool):
            turn(on)
            return {"hook": SinkMaskingPolicy(MaskingConfig(mask_k=1), num_layers=m.num_layers,
                                              is_diffusion=m.is_diffusion)}
        return kwargs, lambda: turn(True)
    trace = os.path.join(folder, "t.arrow")
    if part == "sampler-probs":
        step = steps_module.Steps.step

        def recomputed(self, *args, probs=None, **kw):   # the sampler's probabilities not read
            return step(self, *args, **kw)

        def kwargs(m, on: bool):
            steps_module.Steps.step = recomputed if on else step
            return {"trace": trace}
        return kwargs, lambda: setattr(steps_module.Steps, "step", step)
    if part == "trace-writer":
        writer = writer_module.TraceWriter

        def kwargs(m, on: bool):
            writer_module.TraceWriter = writer if on else KeepNothing
            return {"trace": trace}
        return kwargs, lambda: setattr(writer_module, "TraceWriter", writer)
    if part == "flat-columns":
        flat = writer_module._flat

        def kwargs(m, on: bool):
            writer_module._flat = flat if on else (lambda *args: None)
            return {"trace": trace}
        return kwargs, lambda: setattr(writer_module, "_flat", flat)
    return (lambda m, on: {"hook": NumpyOps(ops if on else 0)}), lambda: None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--part", choices=("kernel-selection", "numpy-ops", "sampler-probs", "trace-writer", "flat-columns"), required=True)
    ap.add_argument("--model", choices=("tiny-arm", "tiny-dlm"), default="tiny-arm")
    ap.add_argument("--ops", type=int, default=30, help="numpy-ops: operations a step")
    ap.add_argument("--rounds", type=int, default=600)
    args = ap.parse_args()
    if args.rounds < 2 or args.ops < 0:
        ap.error("--rounds must be >= 2 and --ops >= 0")
    torch.set_num_threads(1)
    torch.set_grad_enabled(False)
    case = twin_case(args.model)
    folder = tempfile.mkdtemp(prefix="sinklens-switch-")
    make_kwargs, restore = switch(args.part, args.ops, folder)
    m = case.model

    def one(i: int, on: bool) -> float:
        kwargs = make_kwargs(m, on)
        t0 = time.process_time()
        out = m.generate(case.prompts[i % len(case.prompts)], **kwargs, **case.settings)
        hook = kwargs.get("hook")
        if isinstance(hook, SinkMaskingPolicy):
            hook.summary()   # the record of what was blocked, as an eval makes it per sample
        seconds = time.process_time() - t0
        if "trace" in kwargs:   # a user writes a new file (truncating one costs this file system 2-4 ms)
            os.remove(kwargs["trace"])
        return seconds / out.num_steps * 1e6

    for i in range(3):   # warm-up: first-call caches, the kernel's build
        one(i, True), one(i, False)
    on_t, off_t = [], []
    for r in range(args.rounds):
        for on in ((True, False) if r % 2 else (False, True)):
            (on_t if on else off_t).append(one(r, on))
    restore()
    os.rmdir(folder)
    diff = np.array(on_t) - np.array(off_t)
    rng = np.random.default_rng(0)
    se = np.std([np.median(rng.choice(diff, diff.size)) for _ in range(2000)])
    what = args.part if args.part != "numpy-ops" else f"numpy-ops ({args.ops} a step)"
    print(machine())
    print("cold caches: " + cold_routine(m, case.prompts[0]))
    print(f"{args.model}, {args.rounds} paired rounds, one torch thread, process CPU time")
    print("| part | off µs/step | on µs/step | on − off µs/step | on / off |")
    print("|---|---|---|---|---|")
    print(f"| {what} | {np.median(off_t):.0f} | {np.median(on_t):.0f} | {np.median(diff):+.1f} ± {se:.1f} | "
          f"{paired(on_t, off_t)} |")


if __name__ == "__main__":
    main()
