"""What sink masking costs per step, by part, on the shipped twins.

Each twin generates on held-out problems 0-7 (its own sampler settings) three ways, interleaved,
`--repeats` rounds: plain; with a `SinkMaskingPolicy(MaskingConfig(mask_k=1))` hook (as
`sinklens eval --mask-topk 1`); and with the same policy timed by parts (a subclass that times its
own `before_step`, `after_step` — the ranking of the next step's sinks — and `summary`, the record
of what was blocked, made after each generation as the eval does). Then the ranking alone, replayed
on the recorded steps of one generation, outside any generation, and the same calls each right
after a forward of the model (the caches a generation leaves them).

Times: process CPU ms per step, one torch thread, medians over the rounds (the parts: thread CPU
time of the timed calls in the timed run). "rest" = masked − plain − the timed parts: the forward's
capture pass with the blocked keys (the attention the ranking reads, the blocking itself), plus the
forward running slower after the masking's Python (its working set pushed out of the CPU caches).

    python benchmarks/bench_mask_step.py [--repeats 5]
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

import sinklens
from sinklens.experiments.twins import LOAD, arm_sampler, dlm_sampler, heldout_prompt
from sinklens.masking.config import MaskingConfig
from sinklens.masking.policy import SinkMaskingPolicy

PARTS = ("before_step", "after_step", "summary")


class TimedPolicy(SinkMaskingPolicy):
    """The masking policy, its hook calls timed (thread CPU seconds per part)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.spent = dict.fromkeys(PARTS, 0.0)

    def _timed(self, part, fn, *args, **kwargs):
        t0 = time.thread_time()
        out = fn(*args, **kwargs)
        self.spent[part] += time.thread_time() - t0
        return out

    def before_step(self, *args, **kwargs):
        return self._timed("before_step", super().before_step, *args, **kwargs)

    def after_step(self, event):
        return self._timed("after_step", super().after_step, event)

    def summary(self, *args, **kwargs):
        return self._timed("summary", super().summary, *args, **kwargs)


class Recorder:
    wants_attention = True
    wants_query_groups = False

    def __init__(self):
        self.events = []

    def after_step(self, event):
        self.events.append(event)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.set_grad_enabled(False)
    load = os.getloadavg()[0]
    print("| model | plain ms/step | masked ms/step | masked / plain | hook before_step | ranking (after_step) "
          "| record (summary) | rest | ranking replayed alone | ... each after a forward |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name in ("tiny-dlm", "tiny-arm"):
        m = sinklens.load(name, **LOAD)
        prompts = [torch.tensor([m.apply_chat_template(heldout_prompt(i))]) for i in range(8)]
        # the ARM without stop ids: masked and plain generations make the same 16 tokens (bench_trace.py)
        settings = dlm_sampler() if m.is_diffusion else dict(arm_sampler(), eos_token_id=[])

        def policy(cls=SinkMaskingPolicy):
            return cls(MaskingConfig(mask_k=1), num_layers=m.num_layers, is_diffusion=m.is_diffusion, model=m)

        def run(mode):
            steps, t0, parts = 0, time.process_time(), dict.fromkeys(PARTS, 0.0)
            for ids in prompts:
                hook = None if mode == "plain" else policy(TimedPolicy if mode == "timed" else SinkMaskingPolicy)
                steps += m.generate(ids, hook=hook, **settings).num_steps
                if hook is not None:
                    hook.summary()
                    for k, v in getattr(hook, "spent", {}).items():
                        parts[k] += v
            return (time.process_time() - t0) / steps * 1e3, {k: v / steps * 1e3 for k, v in parts.items()}

        for mode in ("plain", "masked", "timed"):
            run(mode)
        rounds = {"plain": [], "masked": [], **{p: [] for p in PARTS}}
        for _ in range(args.repeats):
            rounds["plain"].append(run("plain")[0])
            rounds["masked"].append(run("masked")[0])
            for k, v in run("timed")[1].items():
                rounds[k].append(v)
        med = {k: statistics.median(v) for k, v in rounds.items()}
        # the ranking alone: the policy ranks one generation's recorded steps again and again
        rec, ranker = Recorder(), policy()
        m.generate(prompts[0], hook=[policy(), rec], **settings)
        for _ in range(5):
            for e in rec.events:
                ranker.rank_event(e)
        t0 = time.process_time()
        for _ in range(50):
            for e in rec.events:
                ranker.rank_event(e)
        alone = (time.process_time() - t0) / (50 * len(rec.events)) * 1e3
        # the same calls, each right after a forward of the model (as in a generation): what the
        # forward leaves in the CPU caches, not the ranking's own work, makes the difference
        after, canvas = 0.0, rec.events[-1].tokens
        for _ in range(10):
            for e in rec.events:
                m.forward_logits(canvas)
                t0 = time.process_time()
                ranker.rank_event(e)
                after += time.process_time() - t0
        after = after / (10 * len(rec.events)) * 1e3
        rest = med["masked"] - med["plain"] - sum(med[p] for p in PARTS)
        print(f"| {name} | {med['plain']:.2f} | {med['masked']:.2f} | {med['masked'] / med['plain']:.2f}× | "
              f"{med['before_step']:.3f} | {med['after_step']:.3f} | {med['summary']:.3f} | {rest:.3f} | {alone:.3f} | "
              f"{after:.3f} |")
    print(f"\nload average before / after: {load:.2f} / {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
