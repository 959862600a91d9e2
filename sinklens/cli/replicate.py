"""`sinklens replicate`: Table 1 + sink dynamics of the paper on the shipped tiny twins
(sinklens.experiments.replicate)."""
from __future__ import annotations

from sinklens.cli.types import nonneg_int, positive_int


def k_list(text: str) -> tuple:
    """'0,1,5,1%' -> (0, 1, 5, '1%'), checked like `sinklens eval --mask-topk`."""
    import argparse

    from sinklens.eval.config import parse_k
    try:
        return tuple(parse_k(k) for k in text.split(",") if k.strip())
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def run(a) -> int:
    from sinklens.experiments.replicate import replicate

    res = replicate(a.out, a.n, a.mask_topk, progress=a.progress, n_traces=a.n_traces, control=a.mask_control)
    print(f"table: {res['summary_md']}\ndynamics report: {res['report']}\npersistence: {res['persistence_md']}")
    if "dynamics_md" in res:
        print(f"dynamics over problems: {res['dynamics_md']}")
    return 0


def register(sub) -> None:
    p = sub.add_parser("replicate", help="Table 1 + sink dynamics of the paper on the shipped tiny twins",
                       description=__doc__)
    p.add_argument("--out", default="replicate", help="output folder")
    p.add_argument("--n", type=positive_int, default=200, help="held-out problems")
    p.add_argument("--mask-topk", type=k_list, default=(0, 1, 5, 10),
                   help="comma-separated K values (0 = unmasked; 1%% = a share of the sequence)")
    p.add_argument("--mask-control", choices=["random", "none"], default="random",
                   help="random: a random non-sink-key control row beside every masked row")
    p.add_argument("--n-traces", type=nonneg_int, default=50,
                   help="held-out problems traced for the aggregated dynamics (0 = skip)")
    p.set_defaults(func=run)
