"""The `sinklens` command line: one module per sub-command (sinklens/cli/<command>.py), each
calling library functions; nothing else.

Fast help: only the chosen sub-command's module is imported (the others are listed from the
table below), and the modules import torch / transformers inside their run functions, so
`sinklens --help` and `sinklens report --help` answer without them.
Errors: one line `sinklens <cmd>: error: ...`; exit 2 for bad input (usage, arguments, missing
or unreadable input files), 1 for failures while running; `--debug` shows the traceback.
`--quiet` / `--verbose` / `--debug` work the same in every sub-command (sinklens.cli.logs).
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys

from sinklens.cli.types import CliError, OneLineParser, add_common_flags, check_out

# sub-command -> (module in sinklens/cli/, one-line help). The module's `register(sub)` adds the full parser.
COMMANDS = {
    "demo": ("demo", "trace and report the embedded default model(s) on one prompt"),
    "generate": ("generate", "run a model's own sampler and print the text"),
    "trace": ("trace", "run a model's own sampler and record every step's attention to a trace file"),
    "report": ("report", "figures, summary and an interactive HTML page from one or more traces"),
    "eval": ("eval", "GSM8K / HumanEval / arith accuracy with the top-K sinks masked (paper Table 1)"),
    "eval-summary": ("eval_summary", "Table-1 style summary (markdown + CSV) of eval output directories"),
    "lm-eval-task": ("lm_eval_task", "write the GSM8K lm-eval task YAML for a local data file"),
    "train": ("train", "train a tiny DLM (LLaDA-style) or its ARM twin"),
    "replicate": ("replicate", "Table 1 + sink dynamics of the paper on the shipped tiny twins"),
    "study": ("study", "the controlled study on trained story twins"),
}


def _chosen(argv: list[str]) -> str | None:
    """The sub-command named in argv (the first word that is one), before parsing."""
    return next((a for a in argv if a in COMMANDS), None)


# the sub-commands that run a model's sampler: `sinklens COMMAND --model M --help` lists M's sampler's flags only
SAMPLER_COMMANDS = ("generate", "trace", "eval")


def build_parser(command: str | None = None, sampler: str | None = None) -> argparse.ArgumentParser:
    """The parser; sub-commands other than `command` are listed without their flags
    (command=None: every sub-command in full, e.g. for tests that read all flags). `sampler`:
    `command`'s sampler flags are that sampler's only (`--model M --help`)."""
    p = OneLineParser(prog="sinklens", description="sinklens: where attention goes inside diffusion language "
                      "models while they denoise. Run `sinklens COMMAND --help` for a command's flags.")
    p.add_argument("--version", action="store_true", help="print the version and exit")
    add_common_flags(p)
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module, help_) in COMMANDS.items():
        if command is None or name == command:
            before = set(sub.choices)
            only = {"sampler": sampler} if sampler is not None and name in SAMPLER_COMMANDS else {}
            importlib.import_module(f"sinklens.cli.{module}").register(sub, **only)
            for new in set(sub.choices) - before:
                add_common_flags(sub.choices[new])
        elif name not in sub.choices:
            sub.add_parser(name, help=help_, add_help=False)
    return p


def main(argv: list[str] | None = None) -> int:
    whole_process = argv is None      # the command line of this process, not a call from Python
    argv = sys.argv[1:] if argv is None else list(argv)
    command = _chosen(argv)
    sampler = None
    if command in SAMPLER_COMMANDS and {"-h", "--help"} & set(argv):
        from sinklens.cli.generate import help_sampler
        sampler = help_sampler(command, argv)
    parser = build_parser(command or "", sampler)
    args, extra = parser.parse_known_args(argv)
    if extra:  # said by the sub-command's parser, so the line names it: "sinklens trace: error: ..."
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        said_by = sub.choices.get(getattr(args, "command", None)) or parser
        hint = said_by.did_you_mean(said_by.unknown_flags(extra))
        said_by.error(f"unrecognized arguments: {' '.join(extra)}{hint}")
    if args.version:
        from sinklens._version import __version__
        print(__version__)
        return 0
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    from sinklens.cli import logs
    args.debug = bool(getattr(args, "debug", False))
    try:
        check_out(getattr(args, "out", None), folder=getattr(args, "out_is", "folder") == "folder")
        logs.setup(args)
        if whole_process and args.quiet:   # libraries' own tqdm bars too (transformers' GGUF conversion); tqdm
            os.environ.setdefault("TQDM_DISABLE", "1")   # reads it once, on import: for this process only
        if whole_process:
            logs.progress_for_a_log()        # piped to a file: a plain progress line every N seconds
        from sinklens.cli.launch import maybe_relaunch
        relaunched = maybe_relaunch(args.command, argv)
        if relaunched is not None:
            return relaunched
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print(f"sinklens {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # noqa: BLE001  (every failure becomes one line; --debug shows the traceback)
        if args.debug:
            raise
        code, message = logs.describe(e)
        out = getattr(args, "out", None)
        if isinstance(e, OSError) and out and _under(e.filename, out):
            message = f"--out {out}: {message}"   # the flag the path came from, not only the OS' words
        hint = " (--debug shows the traceback)" if code == 1 and not isinstance(e, OSError) else ""
        print(f"sinklens {args.command}: error: {message}{hint}", file=sys.stderr)
        return code


def _under(path, folder) -> bool:
    """Whether `path` (an OS error's filename: text, bytes or None) is `folder` or lies inside it."""
    if not isinstance(path, str) or not isinstance(folder, (str, os.PathLike)):
        return False
    path, folder = os.path.abspath(path), os.path.abspath(folder)
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


__all__ = ["COMMANDS", "CliError", "build_parser", "main"]
