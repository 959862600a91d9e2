"""`sinklens replicate`: Table 1 + sink dynamics of the paper on the shipped matched twins
(sinklens.experiments.replicate); `--table2 --model M`: the paper's Table 2 protocol on one model
beside the paper's rows (sinklens.experiments.table2)."""
from __future__ import annotations

from pathlib import Path

from sinklens.cli.types import k_list, nonneg_int, positive_int
from sinklens.rule.spec import PROTOCOLS


def default_workers() -> int:
    import os

    return max(1, min(4, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1))


def protocol_list(text: str) -> tuple:
    """'topk,eq3' -> ('topk', 'eq3'), each a known protocol."""
    import argparse

    names = tuple(x.strip() for x in text.split(",") if x.strip())
    bad = [x for x in names if x not in PROTOCOLS]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"must be a comma list of {list(PROTOCOLS)}, got {text!r}")
    return names


def model_list(text: str) -> tuple:
    """'tiny-arm,tiny-dual (ar)' -> the labels, each one of the matched models'."""
    import argparse

    from sinklens.experiments.replicate import model_labels
    names = tuple(x.strip() for x in text.split(",") if x.strip())
    bad = [x for x in names if x not in model_labels()]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"must be a comma list of {model_labels()}, got {text!r}")
    return names


def run(a) -> int:
    if a.study:
        return run_study(a)
    if a.table2 or a.model is not None:
        return run_table2(a)
    from sinklens.experiments.replicate import DEFAULT_N, replicate

    a.n = DEFAULT_N if a.n is None else a.n
    a.n_traces = 50 if a.n_traces is None else a.n_traces
    res = replicate(a.out, a.n, a.mask_topk, progress=a.progress, n_traces=a.n_traces, control=a.mask_control,
                    protocols=a.protocols, models=a.models)
    table = Path(a.out) / "eval" / "summary.md"   # res["summary_md"] is the table's text; files are named by path
    if a.json:
        return print_runs_json({"table": str(table), "table_csv": str(table.with_suffix(".csv")), "report": res["report"],
                                "persistence": res["persistence_md"], "dynamics": res.get("dynamics_md")},
                               Path(a.out) / "eval")
    print(f"{res['summary_md']}\ntable: {table} (and .csv)\ndynamics report: {res['report']}\n"
          f"persistence: {res['persistence_md']}")
    if "dynamics_md" in res:
        print(f"dynamics over problems: {res['dynamics_md']}")
    return 0


def run_table2(a) -> int:
    from sinklens.experiments.table2 import GENERATIONS, table2

    if not (a.table2 and a.model):
        raise ValueError("--table2 and --model go together: sinklens replicate --table2 --model M")
    res = table2(a.model, a.out, GENERATIONS if a.n is None else a.n, data=a.data, progress=a.progress,
                 load_kwargs={k: v for k, v in (("mode", a.mode), ("dtype", a.dtype)) if v is not None})
    if a.json:
        from sinklens.cli.logs import print_json
        print_json({"table": res["path"], "rows": res["rows"], "notes": res["notes"]})
        return 0
    print(f"{res['md']}table: {res['path']} (and .json)")
    return 0


def run_study(a) -> int:
    from sinklens.experiments.study import STUDY_N, STUDY_TRACES, shipped_twins, study

    twins = shipped_twins()
    if not twins:
        raise ValueError("--study: no story twins are shipped in sinklens/assets")
    res = study(twins, a.out, STUDY_N if a.n is None else a.n, STUDY_TRACES if a.n_traces is None else a.n_traces,
                a.mask_topk, a.mask_control, progress=a.progress, workers=a.workers)
    if a.json:
        return print_runs_json({"table": res["study_md"], "every_row": str(Path(a.out) / "eval" / "summary.md"),
                                "dynamics": res.get("dynamics_md")}, Path(a.out) / "eval")
    print(f"table: {res['study_md']}\nevery row: {Path(a.out) / 'eval' / 'summary.md'}\ndynamics: {res.get('dynamics_md')}")
    return 0


def print_runs_json(files: dict, eval_dir: Path) -> int:
    """--json: the result files and every eval run's headline numbers, as one JSON line."""
    from sinklens.cli.logs import print_json
    from sinklens.eval.summary import find_runs, headline

    print_json({**files, "runs": [headline(d) for d in find_runs([str(eval_dir)])]})
    return 0


def register(sub) -> None:
    p = sub.add_parser("replicate", help="Table 1 + sink dynamics of the paper on the shipped tiny twins",
                       description=__doc__)
    p.add_argument("--out", default="replicate", help="output folder")
    p.add_argument("--study", action="store_true",
                   help="the controlled study on the shipped story twins instead of the tiny twins")
    p.add_argument("--n", type=positive_int, default=None,
                   help="held-out problems per cell (default 500; with --study 14 per twin; with --table2 the "
                        "generations, default 30)")
    p.add_argument("--table2", action="store_true",
                   help="the paper's Table 2 protocol (30 generations, length 128, 128 steps, blocks of 32) on "
                        "--model, printed beside the paper's rows for LLaDA-8B, Dream-7B and MMaDA-8B")
    p.add_argument("--model", default=None, help="--table2: the model (alias, folder or hub id)")
    p.add_argument("--mode", default=None, help="--table2: the mode of a checkpoint trained in two (tiny-dual)")
    p.add_argument("--dtype", default=None, help="--table2: float32 | bfloat16 | float16 (default: as stored)")
    p.add_argument("--data", default=None, help="--table2 on a model that is no sinklens twin: a local GSM8K "
                                                "test.jsonl (default: the hub)")
    p.add_argument("--mask-topk", type=k_list, default=(0, 1, 5, 10),
                   help="comma-separated K values (0 = unmasked; 1%% = a share of the sequence)")
    p.add_argument("--protocols", type=protocol_list, default=tuple(PROTOCOLS),
                   help="masking protocols, each its own Table 1 rows: " + "; ".join(
                       f"{k}: {v}" for k, v in PROTOCOLS.items()).replace("%", "%%") + " (default: all)")
    p.add_argument("--models", type=model_list, default=None,
                   help="Table 1 on some of the matched models, a comma list of their labels: tiny-arm, tiny-dlm, "
                        "'tiny-dual (ar)', 'tiny-dual (diffusion)' (default: all four)")
    p.add_argument("--mask-control", choices=["random", "none"], default="random",
                   help="random: a random non-sink-key control row beside every masked row")
    p.add_argument("--n-traces", type=nonneg_int, default=None,
                   help="held-out problems traced for the aggregated dynamics (0 = skip; default 50, with --study 4)")
    p.add_argument("--workers", type=positive_int, default=default_workers(),
                   help="--study: processes that split the samples (default: the CPU cores, at most 4)")
    p.add_argument("--json", action="store_true", help="print one JSON line instead of the text: the result files "
                   "and, per eval run, its folder, model, K, protocol, control, n, accuracy and SE")
    p.set_defaults(func=run)
