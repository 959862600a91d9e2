"""The trace writer, A/B: another tree's `TraceWriter` (e.g. main before a change, extracted with
`git archive`) against this one, on the shipped twins (8 held-out problems each, their own sampler
settings).

- alone: the StepEvents (captured attention included) are recorded once per twin with a hook that
  keeps them; then both writers write them, interleaved, `--repeats` rounds, each trace to a new file
  (removed outside the timing).
- in generation: what tracing adds to a generation: each prompt generated with the attention
  captured and no file (a hook that asks for it and keeps nothing), then traced by each writer, one
  after the other, `--repeats` rounds; the writer's cost is the traced generation's time minus the
  capture-only one's (the writer made as `trace=path` makes it, and closed, inside the timing).
  The same per-step Python runs slower between a model's forwards than on recorded events.

Process CPU time per step (one torch thread), medians over rounds.

    git archive main | tar -x -C before/
    PYTHONPATH=. python benchmarks/bench_trace_writer.py --before before/
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import tempfile
import time

import torch

import sinklens
from sinklens.experiments.twins import LOAD, arm_sampler, dlm_sampler, heldout_prompt
from sinklens.trace import writer as this_writer


class Recorder:
    wants_attention = True  # the sampler captures attention, as for a trace

    def __init__(self):
        self.events = []

    def after_step(self, event):
        self.events.append(event)


class Discard:
    """Asks for the step's attention and keeps nothing: the capture pass alone."""

    wants_attention = True

    def after_step(self, event) -> None:
        pass


def other_writer(tree: str):
    spec = importlib.util.spec_from_file_location("before_writer", os.path.join(tree, "sinklens", "trace", "writer.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write_all(module, generations, num_layers: int, tmp: str) -> float:
    t0 = time.process_time()
    for i, events in enumerate(generations):
        w = module.TraceWriter(os.path.join(tmp, f"{i}.arrow"), {"num_layers": num_layers})
        for e in events:
            w.after_step(e)
        w.close()
    seconds = time.process_time() - t0
    for i in range(len(generations)):
        os.remove(os.path.join(tmp, f"{i}.arrow"))
    return seconds


def generate(m, ids, settings, module, path: str) -> tuple[float, int]:
    """(process CPU seconds, steps) of one generation: traced by `module`'s writer, or capture only (None)."""
    t0 = time.process_time()
    if module is None:
        out = m.generate(ids, hook=Discard(), **settings)
    else:
        writer = module.TraceWriter(path)  # as `trace=path` makes it; the sampler fills in the metadata
        out = m.generate(ids, trace=writer, **settings)
        writer.close()
    seconds = time.process_time() - t0
    if module is not None:
        os.remove(path)  # a user writes a new file: overwriting one costs this file system 2-4 ms
    return seconds, out.num_steps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", required=True, help="root of the other tree (holds sinklens/trace/writer.py)")
    ap.add_argument("--repeats", type=int, default=15)
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.set_grad_enabled(False)
    writers = {"before": other_writer(args.before), "now": this_writer}
    with tempfile.TemporaryDirectory() as tmp:
        for name in ("tiny-dlm", "tiny-arm"):
            m = sinklens.load(name, **LOAD)
            settings = dlm_sampler() if m.is_diffusion else arm_sampler()
            prompts = [torch.tensor([m.apply_chat_template(heldout_prompt(i))]) for i in range(8)]
            generations = []
            for ids in prompts:
                rec = Recorder()
                m.generate(ids, hook=rec, **settings)
                generations.append(rec.events)
            steps = sum(len(g) for g in generations)
            load = os.getloadavg()[0]
            times = {k: [] for k in writers}
            for _ in range(args.repeats):
                for k, module in writers.items():
                    times[k].append(write_all(module, generations, m.num_layers, tmp))
            alone = {k: 1e3 * statistics.median(v) / steps for k, v in times.items()}

            runs = {"capture": None, **writers}
            spent = {k: [] for k in runs}
            for r in range(args.repeats + 1):  # round 0: warm-up
                totals = dict.fromkeys(runs, 0.0)
                for ids in prompts:  # each prompt in every mode in turn: load drifts between prompts, not modes
                    for k, module in runs.items():
                        totals[k] += generate(m, ids, settings, module, os.path.join(tmp, "t.arrow"))[0]
                if r:
                    for k in runs:
                        spent[k].append(totals[k])
            ms = {k: 1e3 * statistics.median(v) / steps for k, v in spent.items()}
            added = {k: 1e3 * statistics.median(a - c for a, c in zip(spent[k], spent["capture"])) / steps
                     for k in writers}
            print(f"{name}: writer ms/step alone: before {alone['before']:.3f}, now {alone['now']:.3f}; "
                  f"in generation (traced - capture only): before {added['before']:.3f}, now {added['now']:.3f} "
                  f"(capture only {ms['capture']:.3f} ms/step); {steps} steps per round, {args.repeats} rounds; "
                  f"load average {load:.2f} / {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
