"""The `sinklens` command line: one sub-command per library function, nothing more."""
from __future__ import annotations

import argparse
import sys

from sinklens.cliargs import CliError, OneLineParser


def build_parser() -> argparse.ArgumentParser:
    # one-line usage errors (exit 2) for every sub-command: subparsers inherit the parser class
    p = OneLineParser(prog="sinklens", description=__doc__)
    p.add_argument("--version", action="store_true", help="print the version and exit")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    from sinklens.report.command import register as register_report; register_report(sub)  # report
    from sinklens.samplers.command import register as register_samplers; register_samplers(sub)  # generate, trace
    from sinklens.eval.commands import register as register_eval; register_eval(sub)  # eval, eval-summary
    from sinklens.experiments.demo import register as register_demo; register_demo(sub)  # demo
    from sinklens.train.command import register as register_train; register_train(sub)  # train
    from sinklens.experiments.replicate import register as register_replicate; register_replicate(sub)  # replicate
    from sinklens.experiments.study import register as register_study; register_study(sub)  # study
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
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
