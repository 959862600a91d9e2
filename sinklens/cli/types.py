"""argparse types for numeric flags: a bad value is a one-line error naming the flag, never a silent default.

Used by every sub-command. Dependency-free on purpose: the command line must answer --help and
reject `--steps 0` before torch is imported.
"""
from __future__ import annotations

import argparse
import difflib
import os
import re
import sys
from contextlib import contextmanager
from pathlib import Path


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Descriptions as written; every flag shows its default (unless its help already says it, or there is none to show)."""

    def _get_help_string(self, action):
        text = action.help or ""
        d = action.default
        if ("default" in text or not action.option_strings or any(d is x for x in (None, False, True, argparse.SUPPRESS))
                or (isinstance(d, (str, tuple, list)) and not d)):     # an empty default: nothing to show
            return text
        # shown as it is typed: a list comma-separated ("0,1,5,10"), not Python's "(0, 1, 5, 10)"
        shown = ",".join(map(str, d)) if isinstance(d, (tuple, list)) else "%(default)s"
        if isinstance(d, (tuple, list)):
            shown = shown.replace("%", "%%")
        return f"{text} (default: {shown})" if text else f"default: {shown}"


class OneLineParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line on stderr (exit status 2), without the usage block;
    its sub-command parsers are OneLineParsers with the same help formatter."""

    def __init__(self, *args, **kwargs):
        kwargs["formatter_class"] = HelpFormatter
        super().__init__(*args, **kwargs)

    def parse_known_args(self, args=None, namespace=None):
        self._argv = list(sys.argv[1:] if args is None else args)   # what error() looks through for typos
        return super().parse_known_args(args, namespace)

    def error(self, message):
        unknown = self.unknown_flags(getattr(self, "_argv", []))
        if unknown and message.startswith(("the following arguments are required", "one of the arguments")):
            # `--mdoel x` reads to argparse as a missing --model: name the typo too, or the line blames the wrong flag
            message = f"unrecognized arguments: {' '.join(unknown)}{self.did_you_mean(unknown)}; {message}"
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")

    def unknown_flags(self, argv: list[str]) -> list[str]:
        """The words of `argv` that look like flags (`--x`, `--x=1`, `-x`) and that this parser does not
        take, neither whole nor as an abbreviation it would accept."""
        known = self._option_string_actions
        unknown = []
        for word in argv:
            if word == "--":
                break
            flag = word.split("=", 1)[0]
            if not flag.startswith("-") or flag == "-" or re.fullmatch(r"-\d[\d.,%e-]*", flag):  # values, -1, -0.5
                continue
            if flag in known or (self.allow_abbrev and flag.startswith("--")
                                 and sum(k.startswith(flag) for k in known) == 1):
                continue
            unknown.append(flag)
        return unknown

    def did_you_mean(self, flags: list[str]) -> str:
        """' (did you mean --model?)' for the flags of this parser closest to `flags`, else ''."""
        close = [m for f in flags for m in difflib.get_close_matches(f, self._option_string_actions, n=1, cutoff=0.7)]
        return f" (did you mean {', '.join(dict.fromkeys(close))}?)" if close else ""


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None


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


def seed(text: str) -> int:
    """A seed: an integer in [0, MAX_SEED] (torch takes 64 bits; an eval adds the sample index)."""
    from sinklens.params import MAX_SEED

    x = _int(text)
    if not 0 <= x <= MAX_SEED:
        raise argparse.ArgumentTypeError(f"must be an integer in [0, {MAX_SEED}] (2**63 - 1), got {text!r}")
    return x


def k_list(text: str) -> tuple:
    """'0,1,5,1%' -> (0, 1, 5, '1%'): the K values of `--mask-topk` (eval, replicate, study); an
    empty element ('1,,2') is refused, not dropped."""
    from sinklens.eval.config import parse_k   # imports no torch

    try:
        return tuple(parse_k(k) for k in text.split(","))
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


class CliError(ValueError):
    """Bad input found by a command after parsing: `sinklens.cli.main` prints it as one line, exit status 2."""


def check_out(path: str | None, folder: bool) -> None:
    """`--out` refused before any work when it cannot be written: a file where a folder is wanted,
    or a file standing where a folder on its way should be (`--out notes.txt/run.arrow`)."""
    if not path:
        return
    p = Path(path)
    if folder and p.exists() and not p.is_dir():
        raise CliError(f"--out {path!r} is a file; expected a folder (a new or existing one)")
    for parent in p.parents:
        if parent.exists():
            if not parent.is_dir():
                raise CliError(f"--out {path!r}: {str(parent)!r} is a file, not a folder")
            return


@contextmanager
def out_folder(path: str):
    """--out made before the work, so that a place no folder can be made fails now and not after the
    work; removed again when the work fails and leaves it empty (bad input writes nothing)."""
    made = not os.path.exists(path)
    os.makedirs(path, exist_ok=True)
    try:
        yield
    except BaseException:
        if made and os.path.isdir(path) and not os.listdir(path):
            os.rmdir(path)
        raise


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
