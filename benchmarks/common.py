"""What the benchmark scripts share: the machine line every table is read with, and paired ratios.

A round times every mode once, back to back, so its ratio compares times taken under one load; the
host's load moves between rounds. The summary of a mode against a base is the median of the rounds'
own ratios, with its standard error from a bootstrap over the rounds (seeded: a rerun on the same
times prints the same) and the range of the rounds.
"""
from __future__ import annotations

import contextlib
import os
import platform
import random
import statistics
import subprocess
import sys
import time

import numpy as np
import torch


def machine() -> str:
    """The CPU model, its vector ISA, the load average and whether the compiled route built: every table
    is read with these (a shared machine's load moves ratios)."""
    from sinklens.attention.routes import build

    model, flags = None, set()
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name") and model is None:
                model = line.split(":", 1)[1].strip()
            elif line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    isa = " ".join(f for f in ("avx2", "fma", "avx512f", "avx512_bf16", "amx_bf16", "asimd", "sve") if f in flags)
    kernel = "built" if build.load() is not None else f"unavailable ({build.reason()})"
    model = model or platform.processor() or platform.machine()
    return (f"cpu: {model}; {os.cpu_count()} cores; isa: {isa or '?'}; torch {torch.__version__}; compiled route: {kernel}\n"
            "load average (1, 5, 15 min) at start: %.2f %.2f %.2f" % os.getloadavg())


@contextlib.contextmanager
def beside_busy(on: bool = True):
    """With `on`: a second process spinning on one core for the duration (`--beside-busy`), so a table
    says how its ratios move under contention; it is stopped on the way out, error or not."""
    if not on:
        yield
        return
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    print(f"beside a busy process (pid {busy.pid}: one core spinning in Python)", flush=True)
    try:
        yield
    finally:
        busy.kill()
        busy.wait()


def paired(mode: list[float], base: list[float], resamples: int = 2000) -> str:
    """"1.100x ± 0.012 (0.98-1.25)": median of mode[i] / base[i] over the rounds i, its bootstrap standard
    error (from 4 rounds on) and the rounds' range."""
    r = sorted(m / b for m, b in zip(mode, base))
    med = statistics.median(r)
    if len(r) < 4:
        return f"{med:.3f}x" + (f" ({r[0]:.2f}-{r[-1]:.2f})" if len(r) > 1 else "")
    rng = random.Random(0)
    se = statistics.stdev(statistics.median(rng.choices(r, k=len(r))) for _ in range(resamples))
    return f"{med:.3f}x ± {se:.3f} ({r[0]:.2f}-{r[-1]:.2f})"


def cold_routine(model, ids: torch.Tensor, rounds: int = 40) -> str:
    """How much this host's caches lose to a forward right now: the median CPU time of one numpy routine
    (a cumsum of 17 ints) called first after a plain forward of `model` on `ids`, against the same call
    again. A tiny model's capture, trace writer and masking are many such routines each step and
    generation, so their ratios may move with this figure: the same commit's traced tiny-arm ratio moved
    0.07 between two runs an hour apart on one VM, at one load average (docs/benchmarks.md)."""
    a = np.arange(17, dtype=np.int32)
    first, again = [], []
    for _ in range(rounds):
        model.forward_logits(ids)
        t0 = time.perf_counter_ns()
        np.cumsum(a)
        t1 = time.perf_counter_ns()
        np.cumsum(a)
        t2 = time.perf_counter_ns()
        first.append(t1 - t0)
        again.append(t2 - t1)
    return (f"a numpy routine's first call after a forward: {statistics.median(first) / 1e3:.0f} µs, "
            f"called again: {statistics.median(again) / 1e3:.1f} µs (median of {rounds})")
