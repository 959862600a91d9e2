"""What the command line shows besides results: progress, notes, library warnings, errors.

--quiet: results and errors only (no bars, no notes). Default: bars and notes on stderr;
library chatter (transformers' info/warnings) hidden. --verbose: library warnings and info too.
--debug: as --verbose, and a failure shows its traceback instead of one line.
Notes are printed with `note(...)` (stderr, only by the main process under a launcher).
Progress in a log: when stderr is not a terminal (piped to a file), the bars' `\r` redraws
become a plain line every `SINKLENS_PROGRESS_EVERY` seconds (default 30) and the bar's last
state (`ProgressLines`), instead of hundreds of redraws joined on a few lines.
"""
from __future__ import annotations

import argparse
import os
import sys

# Exceptions that mean "the input is wrong" (exit 2); anything else failed while running (exit 1).
INPUT_ERRORS = (ValueError, TypeError, LookupError, FileNotFoundError, IsADirectoryError, NotADirectoryError,
                FileExistsError, PermissionError)

_LEVEL = {"quiet": False, "verbose": False}
PROGRESS_EVERY_S = 30.0   # a log's progress line interval (SINKLENS_PROGRESS_EVERY overrides)


class ProgressLines:
    """A text stream for a log in place of stderr: a progress bar's redraws (text after `\r`,
    as tqdm writes them) become a plain line, at most one every `every` seconds, plus the bar's
    last state when it ends; cleared bars leave nothing; every other write passes unchanged."""

    def __init__(self, stream, every: float = PROGRESS_EVERY_S, clock=None):
        import re
        import time

        self.stream, self.every, self.clock = stream, every, clock or time.monotonic
        self.split = re.compile(r"(\r|\n)").split
        self.bar, self.redrawing, self.said, self.said_at = "", False, None, float("-inf")

    def write(self, text: str) -> int:
        for piece in self.split(text):
            if piece == "\r":
                self._offer(final=False)
                self.bar, self.redrawing = "", True
            elif piece == "\n":
                if self.redrawing:
                    self._offer(final=True)
                else:
                    self.stream.write("\n")
                self.bar, self.redrawing = "", False
            elif self.redrawing:
                self.bar += piece
            else:
                self.stream.write(piece)
        if self.redrawing:
            self._offer(final=False)
        return len(text)

    def _offer(self, final: bool) -> None:
        """The bar as drawn now: written as a line when it ends or `every` seconds have passed."""
        bar, now = self.bar.rstrip(), self.clock()
        if bar and bar != self.said and (final or now - self.said_at >= self.every):
            self.stream.write(bar + "\n")
            self.stream.flush()
            self.said, self.said_at = bar, now

    def isatty(self) -> bool:
        return False

    def __getattr__(self, name):          # flush, fileno, encoding, ...: the stream's own
        return getattr(self.stream, name)


def progress_for_a_log() -> None:
    """This process's stderr, when it is not a terminal, through `ProgressLines` (command-line entry only)."""
    if isinstance(sys.stderr, ProgressLines) or sys.stderr.isatty():
        return
    try:
        every = float(os.environ.get("SINKLENS_PROGRESS_EVERY", PROGRESS_EVERY_S))
    except ValueError:
        every = PROGRESS_EVERY_S
    sys.stderr = ProgressLines(sys.stderr, every)


def setup(args: argparse.Namespace) -> None:
    """Fill args.quiet / verbose / debug / progress and set the libraries' verbosity."""
    for name in ("quiet", "verbose", "debug"):
        setattr(args, name, bool(getattr(args, name, False)))
    args.verbose = args.verbose or args.debug
    if args.quiet and args.verbose:
        from sinklens.cli.types import CliError
        raise CliError("--quiet and --verbose/--debug exclude each other")
    args.progress = not args.quiet
    _LEVEL.update(quiet=args.quiet, verbose=args.verbose)
    # transformers reads these when imported (the commands import it later); when it is already
    # imported (main() called from Python) its own switches are used
    level = "info" if args.verbose else "error"
    os.environ["TRANSFORMERS_VERBOSITY"] = level
    if not args.verbose:  # "Loading weights" bars and advisory notes are noise for a command's user
        os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
        os.environ["TRANSFORMERS_NO_ADVISORY_WARNINGS"] = "1"
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if "transformers" in sys.modules:
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_info() if args.verbose else hf_logging.set_verbosity_error()
        hf_logging.enable_progress_bar() if args.verbose else hf_logging.disable_progress_bar()


def note(message: str) -> None:
    """An informative line on stderr (not with --quiet; only on the main process)."""
    if not _LEVEL["quiet"] and int(os.environ.get("RANK", "0") or 0) == 0:
        print(message, file=sys.stderr)


def quiet() -> bool:
    """True under --quiet, or on a process other than the main one."""
    return _LEVEL["quiet"] or int(os.environ.get("RANK", "0") or 0) != 0


def verbose(message: str) -> None:
    if _LEVEL["verbose"]:
        note(message)


def describe(e: BaseException) -> tuple[int, str]:
    """(exit status, one-line message) of a failure."""
    if isinstance(e, OSError) and e.filename is not None and e.strerror:
        text = f"{e.strerror}: {e.filename}"
    else:
        text = str(e) or type(e).__name__
        if isinstance(e, KeyError) and len(e.args) == 1 and isinstance(e.args[0], str):
            text = e.args[0]  # str(KeyError) adds quotes
    code = 2 if isinstance(e, INPUT_ERRORS) else 1
    if code == 1 and not isinstance(e, OSError):
        text = f"{type(e).__name__}: {text}"
    text = " ".join(text.split())  # one line
    return code, text if len(text) <= 600 else text[:597] + "..."


def print_json(doc: dict) -> None:
    """One JSON line on stdout for a machine to read (`--json`): NaN becomes null, paths text."""
    import json
    import math

    def clean(x):
        if isinstance(x, float) and not math.isfinite(x):
            return None
        if isinstance(x, dict):
            return {str(k): clean(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [clean(v) for v in x]
        if hasattr(x, "item") and not isinstance(x, (str, bytes)):   # numpy scalars
            return clean(x.item())
        return x if x is None or isinstance(x, (str, int, float, bool)) else str(x)

    print(json.dumps(clean(doc)))
