"""What the command line shows besides results: progress, notes, library warnings, errors.

--quiet: results and errors only (no bars, no notes). Default: bars and notes on stderr;
library chatter (transformers' info/warnings) hidden. --verbose: library warnings and info too.
--debug: as --verbose, and a failure shows its traceback instead of one line.
Notes are printed with `note(...)` (stderr, only by the main process under a launcher).
"""
from __future__ import annotations

import argparse
import os
import sys

# Exceptions that mean "the input is wrong" (exit 2); anything else failed while running (exit 1).
INPUT_ERRORS = (ValueError, TypeError, LookupError, FileNotFoundError, IsADirectoryError, NotADirectoryError,
                FileExistsError, PermissionError)

_LEVEL = {"quiet": False, "verbose": False}


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
