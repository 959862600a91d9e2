"""`sinklens replicate`: the paper's Table 1 (and its dynamics figures) at CPU scale, on the twins.

1. Accuracy on held-out arithmetic problems, unmasked and with the top-K sinks masked
   (K = 1, 5, 10; per-head ranking from the previous step, SPEC §4), for the tiny DLM and its
   ARM twin, with standard errors: `sinklens.eval` on task "arith" -> `<out>/eval/summary.md`.
2. Sink dynamics: both twins traced on a held-out problem and reported (largest-sink
   movement, sink counts per layer, the tokens sinks sit on, figures) -> `<out>/dynamics/`.
Resumable: the eval part skips samples already on disk.
"""
from __future__ import annotations

from pathlib import Path

from sinklens.train.demo_defaults import dlm_sampler


def replicate(out: str | Path, n: int = 200, mask_topk: tuple[int, ...] = (0, 1, 5, 10),
              progress: bool = True) -> dict:
    from sinklens.demo import run_demo
    from sinklens.eval.runner import EvalConfig, run_eval
    from sinklens.eval.summary import write_summary
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    out = Path(out)
    for name in ("tiny-dlm", "tiny-arm"):
        run_eval(EvalConfig(model=name, task="arith", out=str(out / "eval"), mask_topk=mask_topk, limit=n,
                            shots=0, chat="on", block_length=dlm_sampler()["block_length"], dtype="float32",
                            loglik=False, progress=progress))
    md, csv = write_summary([str(out / "eval")], str(out / "eval"))
    html = run_demo(out / "dynamics", quiet=not progress)
    return {"summary_md": md, "summary_csv": csv, "report": str(html)}


def register(sub) -> None:
    p = sub.add_parser("replicate", help="Table 1 + sink dynamics of the paper on the shipped tiny twins",
                       description=__doc__)
    p.add_argument("--out", default="replicate", help="output folder (default: replicate)")
    p.add_argument("--n", type=int, default=200, help="held-out problems (default 200)")
    p.add_argument("--mask-topk", default="0,1,5,10", help="comma-separated K values (0 = unmasked)")
    p.add_argument("--quiet", action="store_true")

    def _run(a) -> int:
        ks = tuple(int(k) for k in a.mask_topk.split(","))
        res = replicate(a.out, a.n, ks, progress=not a.quiet)
        print(f"table: {res['summary_md']}\ndynamics report: {res['report']}")
        return 0
    p.set_defaults(func=_run)
