"""`sinklens eval-summary DIR [DIR ...]`: the Table-1 style summary (markdown + CSV) of eval output folders."""
from __future__ import annotations


def run(args) -> int:
    from sinklens.eval.summary import write_summary

    md, _ = write_summary(args.dirs, args.out or args.dirs[0])
    print(md)
    return 0


def register(sub) -> None:
    s = sub.add_parser("eval-summary", help="Table-1 style summary (markdown + CSV) of eval output directories",
                       description=__doc__)
    s.add_argument("dirs", nargs="+", help="eval output directories (several models side by side)")
    s.add_argument("--out", default=None, help="where summary.md / summary.csv go (default: the first dir)")
    s.set_defaults(func=run)
