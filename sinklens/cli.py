"""The `sinklens` command line: one sub-command per library function, nothing more."""
from __future__ import annotations

import argparse
import importlib
import sys

from sinklens.cliargs import CliError, OneLineParser


# Each module's register(sub) adds these sub-commands. Only the module of the command that runs
# is imported: `sinklens report` then never imports torch / transformers (~300 MB and ~5 s that
# a report does not use; docs/benchmarks.md). `sinklens --help` imports them all.
COMMANDS = (
    ("sinklens.report.command", ("report",)),
    ("sinklens.samplers.command", ("generate", "trace")),
    ("sinklens.eval.commands", ("eval", "eval-summary")),
    ("sinklens.experiments.demo", ("demo",)),
    ("sinklens.train.command", ("train",)),
    ("sinklens.experiments.replicate", ("replicate",)),
    ("sinklens.experiments.study", ("study",)),
)


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser; with a known `command`, only that command's module is imported."""
    # one-line usage errors (exit 2) for every sub-command: subparsers inherit the parser class
    p = OneLineParser(prog="sinklens", description=__doc__)
    p.add_argument("--version", action="store_true", help="print the version and exit")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    known = any(command in names for _, names in COMMANDS)
    for module, names in COMMANDS:
        if not known or command in names:
            importlib.import_module(module).register(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(next((a for a in argv if not a.startswith("-")), None))
    args = parser.parse_args(argv)
    if args.version:
        from sinklens._version import __version__
        print(__version__)
        return 0
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except CliError as e:          # bad input found after parsing: one line, exit status 2
        print(f"sinklens {args.command}: error: {e}", file=sys.stderr)
        raise


if __name__ == "__main__":
    sys.exit(main())
