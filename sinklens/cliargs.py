"""argparse types for numeric flags: a bad value is a one-line error naming the flag, never a silent default.

Used by every sub-command (eval, trace, generate, report). Dependency-free on purpose: the
command line must be able to reject `--steps 0` before torch is imported.
"""
from __future__ import annotations

import argparse
import math


class OneLineParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line on stderr (exit status 2), without the usage block."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None


def _float(text: str) -> float:
    try:
        x = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(x):                 # float() accepts "nan" and "inf"; no flag means them
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return x


def positive_int(text: str) -> int:
    x = _int(text)
    if x < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer (>= 1), got {text!r}")
    return x


def nonneg_int(text: str) -> int:
    x = _int(text)
    if x < 0:
        raise argparse.ArgumentTypeError(f"must be an integer >= 0, got {text!r}")
    return x


def finite_float(text: str) -> float:
    return _float(text)


def positive_float(text: str) -> float:
    x = _float(text)
    if not x > 0:
        raise argparse.ArgumentTypeError(f"must be a number > 0, got {text!r}")
    return x


def nonneg_float(text: str) -> float:
    x = _float(text)
    if x < 0:
        raise argparse.ArgumentTypeError(f"must be a number >= 0, got {text!r}")
    return x


def probability(text: str) -> float:
    """In (0, 1]: top-p."""
    x = _float(text)
    if not 0 < x <= 1:
        raise argparse.ArgumentTypeError(f"must lie in (0, 1], got {text!r}")
    return x


def open_unit(text: str) -> float:
    """In (0, 1): Dream's schedule end eps."""
    x = _float(text)
    if not 0 < x < 1:
        raise argparse.ArgumentTypeError(f"must lie strictly between 0 and 1, got {text!r}")
    return x


def int_list(text: str, minimum: int = 0) -> tuple[int, ...]:
    """'0,1,5' -> (0, 1, 5); every value >= minimum, at least one."""
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers like 0,1,5, got {text!r}") from None
    if not values or any(v < minimum for v in values):
        raise argparse.ArgumentTypeError(f"expected comma-separated integers >= {minimum}, got {text!r}")
    return values


def nonneg_int_list(text: str) -> tuple[int, ...]:
    return int_list(text, 0)


class CliError(SystemExit):
    """Bad input found by a command after parsing: `sinklens.cli.main` prints it as one line; exit status 2."""

    def __init__(self, message: str):
        super().__init__(2)
        self.message = message

    def __str__(self) -> str:
        return self.message

