"""Accuracy / pass@1 with its standard error (the ± of the paper's Table 1)."""
from __future__ import annotations

import math


def mean_stderr(values: list[float]) -> tuple[float, float]:
    """Mean and standard error of the mean (sample std / sqrt(n), as lm-eval reports); n < 2 → stderr nan."""
    n = len(values)
    if n == 0:
        return float("nan"), float("nan")
    mean = sum(values) / n
    if n < 2:
        return mean, float("nan")
    var = sum((v - mean) ** 2 for v in values) / (n - 1)
    return mean, math.sqrt(var / n)
