"""The trace writer alone, A/B: another tree's `TraceWriter` (e.g. main before a change, extracted
with `git archive`) against this one, on the same StepEvents of real twin generations.

The events (captured attention included) are recorded once per twin, 8 held-out problems, with
a hook that keeps them; then both writers write them, interleaved, `--repeats` rounds, each
trace to a new file (removed outside the timing). Process CPU time per step, medians.

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
            generations = []
            for i in range(8):
                rec = Recorder()
                m.generate(torch.tensor([m.apply_chat_template(heldout_prompt(i))]), hook=rec, **settings)
                generations.append(rec.events)
            steps = sum(len(g) for g in generations)
            times = {k: [] for k in writers}
            for _ in range(args.repeats):
                for k, module in writers.items():
                    times[k].append(write_all(module, generations, m.num_layers, tmp))
            ms = {k: 1e3 * statistics.median(v) / steps for k, v in times.items()}
            print(f"{name}: writer ms/step before {ms['before']:.3f}, now {ms['now']:.3f} "
                  f"({steps} steps per round, {args.repeats} rounds; load average {os.getloadavg()[0]:.2f})")


if __name__ == "__main__":
    main()
