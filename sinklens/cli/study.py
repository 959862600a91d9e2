"""`sinklens study --run dlm=RUN --run arm=RUN --run dlm-from-arm=RUN --out DIR`: the
controlled study on trained story twins (sinklens.experiments.study)."""
from __future__ import annotations

import argparse
from pathlib import Path

from sinklens.cli.replicate import default_workers
from sinklens.cli.types import k_list, nonneg_int, positive_int


def label_run(text: str) -> tuple[str, str]:
    if "=" not in text:
        raise argparse.ArgumentTypeError(f"expected LABEL=FOLDER, got {text!r}")
    label, folder = text.split("=", 1)
    return label, folder


def run(a) -> int:
    from sinklens.cli.types import CliError
    from sinklens.experiments.study import study

    labels = [label for label, _ in a.run]
    twice = sorted({x for x in labels if labels.count(x) > 1})
    if twice:    # dict() would keep the last run of a label and drop the others without a word
        raise CliError(f"--run label {', '.join(map(repr, twice))} given more than once; give each twin its own label")
    res = study(dict(a.run), a.out, a.n, a.n_traces, a.mask_topk, progress=a.progress, workers=a.workers)
    print(f"table: {res['study_md']}\nevery row: {Path(a.out) / 'eval' / 'summary.md'}\ndynamics: {res.get('dynamics_md')}")
    return 0


def register(sub) -> None:
    from sinklens.experiments import study

    p = sub.add_parser("study", help="the controlled study on trained story twins", description=study.__doc__)
    p.add_argument("--run", action="append", required=True, metavar="LABEL=RUN", type=label_run,
                   help="a twin and its label (repeat per twin): a finished training run folder, or a shipped twin "
                        "(alias or exported folder); a dual twin (--kind dual) gives two rows, 'LABEL (ar)' and "
                        "'LABEL (diffusion)'")
    p.add_argument("--out", default="study", help="output folder")
    p.add_argument("--n", type=positive_int, default=50, help="held-out problems per run")
    p.add_argument("--mask-topk", type=k_list, default=(0, 1, 5, 10),
                   help="comma-separated K values (0 = unmasked; 2%% = a share)")
    p.add_argument("--n-traces", type=nonneg_int, default=20, help="held-out problems traced per model")
    p.add_argument("--workers", type=positive_int, default=default_workers(),
                   help="processes that split the samples (default: the CPU cores, at most 4)")
    p.set_defaults(func=run)
