"""Corpus runs: peak memory flat in the number of prompts; time per step of a disk-offloaded model.

1. memory: `sinklens trace --prompts` over N = 20 and N = 200 prompts of the shipped tiny-dlm
   twin (1 step, 2 new tokens each), each run in a fresh process through the CLI; its peak RSS
   (ru_maxrss of the child). Rounds alternate 20, 200, 20, 200, ... so machine load hits both.
2. offload: a `generate` with trace of tiny-dlm loaded whole vs loaded with device_map="auto",
   max_memory={"cpu": weights / 4} and disk offload (the layers that do not fit are read from
   disk at every forward), interleaved in one process; seconds per denoising step.
3. stream: one prompt's corpus parts the way a corpus run now gets them (each step folded as the
   sampler runs, no file: sinklens/eval/stream.py) vs the way it did before (trace to a file,
   then `reduce_trace`: analyse and reduce), tiny-dlm with every readout on, interleaved in one
   process, one thread; seconds per prompt, the trace file's bytes, and that both give the same parts.

    PYTHONPATH=. python benchmarks/bench_corpus.py --dir /tmp/bench_corpus

The children are `python -m sinklens.cli`, whose sys.path starts with the current directory:
run it from the checkout you mean to measure.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path


def peak_rss_mb(prompts: Path, out: Path) -> tuple[float, float]:
    """(peak RSS in MB, wall seconds) of one corpus run in a fresh process."""
    code = ("import resource, sys; from sinklens.cli import main; rc = main(sys.argv[1:]); "
            "print('PEAK', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss); sys.exit(rc)")
    args = ["trace", "--model", "tiny-dlm", "--prompts", str(prompts), "--out", str(out), "--steps", "1",
            "--gen-length", "2", "--block-length", "2", "-q"]
    t0 = time.perf_counter()
    res = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    wall = time.perf_counter() - t0
    if res.returncode != 0:
        raise RuntimeError(res.stderr[-2000:])
    kb = int(next(line.split()[1] for line in res.stdout.splitlines() if line.startswith("PEAK")))
    return kb / 1024, wall


def memory(root: Path, sizes=(20, 200), rounds: int = 2) -> dict:
    files = {}
    for n in sizes:
        files[n] = root / f"prompts{n}.jsonl"
        files[n].write_text("".join(json.dumps({"prompt": f"{i} + {i % 9 + 1} ="}) + "\n" for i in range(n)))
    out = {n: [] for n in sizes}
    for r in range(rounds):
        for n in sizes:
            rss, wall = peak_rss_mb(files[n], root / f"run{n}_{r}")
            out[n].append((rss, wall))
            print(f"round {r}: N = {n:4d} prompts: peak RSS {rss:7.1f} MB, {wall:6.1f} s", flush=True)
    return out


def offload(root: Path, rounds: int = 5, steps: int = 8) -> dict:
    import torch

    from sinklens.models.loader import load, resolve

    weights = os.path.getsize(resolve("tiny-dlm").folder / "model.safetensors")
    models = {"whole": load("tiny-dlm"),
              "offloaded": load("tiny-dlm", device_map="auto", max_memory={"cpu": weights // 4},
                                offload_folder=root / "offload")}
    print("offloaded placement:", models["offloaded"].model.hf_device_map)
    ids = torch.tensor([models["whole"].apply_chat_template("Tom has 3 apples and gets 2 more. How many?")])
    times = {k: [] for k in models}
    for r in range(rounds + 1):                      # round 0 warms up, not counted
        for name, m in models.items():
            torch.manual_seed(0)
            t0 = time.perf_counter()
            m.generate(ids, trace=root / f"{name}.arrow", steps=steps, gen_length=steps, block_length=steps)
            if r:
                times[name].append((time.perf_counter() - t0) / steps)
    for name, ts in times.items():
        ts.sort()
        print(f"{name:9s}: {1e3 * ts[len(ts) // 2]:7.1f} ms per step (median of {len(ts)}; "
              f"min {1e3 * ts[0]:.1f}, max {1e3 * ts[-1]:.1f})")
    ratio = sorted(o / w for o, w in zip(times["offloaded"], times["whole"]))
    print(f"offloaded / whole, per round: median {ratio[len(ratio) // 2]:.2f}x "
          f"(min {ratio[0]:.2f}, max {ratio[-1]:.2f})")
    return times


def stream_vs_trace(root: Path, rounds: int = 5, prompts: int = 4, steps: int = 16) -> dict:
    import torch

    from sinklens.eval.corpus import reduce_trace
    from sinklens.eval.stream import StreamWriter
    from sinklens.models.loader import load
    from sinklens.samplers.capture import CaptureOptions

    torch.set_num_threads(1)
    m = load("tiny-dlm")
    capture = CaptureOptions(value_norms=True, qk_norms=True, diagonal=True, distance=True, hidden_norms=True,
                             lens_layers=[1])
    settings = dict(steps=steps, gen_length=steps, block_length=steps)
    ids = [torch.tensor([m.apply_chat_template(f"Tom has {i} apples and gets {i % 7 + 1} more. How many?")])
           for i in range(prompts)]

    def streamed(i: int) -> dict:
        torch.manual_seed(i)
        w = StreamWriter("scaled_sum", 3.0)
        m.generate(ids[i], trace=w, capture=capture, **settings)
        return w.parts()

    def traced(i: int) -> dict:
        torch.manual_seed(i)
        path = root / "scratch.arrow"
        m.generate(ids[i], trace=path, capture=capture, **settings)
        traced.bytes = path.stat().st_size
        parts = reduce_trace(str(path), "scaled_sum", 3.0)
        path.unlink()
        return parts

    times = {"stream": [], "trace": []}
    for r in range(rounds + 1):                      # round 0 warms up, not counted
        for name, fn in (("stream", streamed), ("trace", traced)):
            t0 = time.perf_counter()
            parts = [fn(i) for i in range(prompts)]
            if r:
                times[name].append((time.perf_counter() - t0) / prompts)
            if name == "stream":
                first = parts
            elif json.dumps(parts) != json.dumps(first):
                raise RuntimeError("the streamed parts differ from reduce_trace's")
    for name, ts in times.items():
        ts = sorted(ts)
        print(f"{name:6s}: {1e3 * ts[len(ts) // 2]:7.1f} ms per prompt of {steps} steps (median of {len(ts)} rounds; "
              f"min {1e3 * ts[0]:.1f}, max {1e3 * ts[-1]:.1f})")
    ratio = sorted(s / t for s, t in zip(times["stream"], times["trace"]))
    print(f"stream / trace, per round: {', '.join(f'{x:.2f}' for x in ratio)} (median {ratio[len(ratio) // 2]:.2f}x); "
          f"parts identical; the trace path's scratch file: {traced.bytes / 1024:.1f} kB per prompt", flush=True)
    return times


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dir", required=True, help="scratch folder (corpus runs, offloaded weights)")
    p.add_argument("--rounds", type=int, default=2, help="memory rounds (each runs N = 20 and N = 200)")
    p.add_argument("--skip-memory", action="store_true")
    p.add_argument("--skip-offload", action="store_true")
    p.add_argument("--skip-stream", action="store_true")
    args = p.parse_args()
    root = Path(args.dir)
    root.mkdir(parents=True, exist_ok=True)
    print(f"load average {os.getloadavg()}, {os.cpu_count()} CPUs", flush=True)
    if not args.skip_offload:
        offload(root)
    if not args.skip_stream:
        stream_vs_trace(root)
    if not args.skip_memory:
        memory(root, rounds=args.rounds)
    print(f"load average {os.getloadavg()}", flush=True)


if __name__ == "__main__":
    main()
