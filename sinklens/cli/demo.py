"""`sinklens demo`: trace and report the embedded default model(s) on one prompt
(sinklens.experiments.demo: the shipped tiny twins, else SmolLM2-135M-Instruct)."""
from __future__ import annotations


def run(args) -> int:
    from sinklens.experiments.demo import run_demo

    if args.prompt is not None and not args.prompt.strip():   # else the default would run in its place, unsaid
        from sinklens.cli.types import CliError
        raise CliError("--prompt is empty: expected the text to trace (leave --prompt out for the default problem)")

    run_demo(args.out, prompt=args.prompt, quiet=not args.progress)
    return 0


def register(sub) -> None:
    from sinklens.experiments import demo

    p = sub.add_parser("demo", help="trace and report the embedded default model(s) on one prompt",
                       description=demo.__doc__)
    p.add_argument("--out", default="demo-report", help="output folder")
    p.add_argument("--prompt", default=None, help="prompt to trace (default: a held-out arithmetic problem)")
    p.set_defaults(func=run)
