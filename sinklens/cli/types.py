"""argparse types for numeric flags: a bad value is a one-line error naming the flag, never a silent default.

Used by every sub-command. Dependency-free on purpose: the command line must answer --help and
reject `--steps 0` before torch is imported.
"""
from __future__ import annotations

import argparse
import math


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Descriptions as written; every flag shows its default (unless its help already says it, or there is none to show)."""

    def _get_help_string(self, action):
        text = action.help or ""
        if ("default" in text or not action.option_strings
                or any(action.default is x for x in (None, False, True, argparse.SUPPRESS))):
            return text
        return f"{text} (default: %(default)s)" if text else "default: %(default)s"


class OneLineParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line on stderr (exit status 2), without the usage block;
    its sub-command parsers are OneLineParsers with the same help formatter."""

    def __init__(self, *args, **kwargs):
        kwargs["formatter_class"] = HelpFormatter
        super().__init__(*args, **kwargs)

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


class CliError(ValueError):
    """Bad input found by a command after parsing: `sinklens.cli.main` prints it as one line, exit status 2."""


def add_common_flags(p: argparse.ArgumentParser) -> None:
    """--quiet / --verbose / --debug, the same in every sub-command (and before it:
    `sinklens --debug trace ...`). SUPPRESS: a flag given before the sub-command is not reset by it."""
    g = p.add_argument_group("output")
    g.add_argument("-q", "--quiet", "--no-progress", dest="quiet", action="store_true", default=argparse.SUPPRESS,
                   help="no progress bars or notes, only results and errors (--no-progress: same)")
    g.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                   help="more detail: timings, notes, library warnings (transformers, accelerate)")
    g.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                   help="show the full traceback of an error (implies --verbose)")
