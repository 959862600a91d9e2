"""Ratios of rounds that ran the compared modes back to back (one helper for the benchmark scripts).

A round times every mode once, back to back, so its ratio compares times taken under one load; the
host's load moves between rounds. The summary of a mode against a base is the median of the rounds'
own ratios, with its standard error from a bootstrap over the rounds (seeded: a rerun on the same
times prints the same) and the range of the rounds.
"""
from __future__ import annotations

import random
import statistics


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
