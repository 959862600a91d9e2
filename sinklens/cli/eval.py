"""`sinklens eval`: Table-1 accuracy with the top-K sinks masked (the work is in sinklens.eval.runner).

    sinklens eval --model tiny-dlm --task arith --mask-topk 0,1,5 --limit 20 --out eval-out
    sinklens eval --model ./LLaDA-8B-Instruct --task gsm8k --data test.jsonl --mask-topk 0,1 --out out
    torchrun --nproc_per_node 2 -m sinklens.cli eval ...     # data parallel (docs/evaluation.md)
"""
from __future__ import annotations

import os
import sys

from sinklens.cli.fields import add_config_flags, flag_values
from sinklens.cli.generate import add_sampler_flags, sampler_args, sampler_title
from sinklens.cli.types import CliError, k_list
from sinklens.sandbox import SandboxUnavailable


def register(sub, sampler: str | None = None) -> None:
    from sinklens.eval.config import EvalConfig

    p = sub.add_parser("eval", help="GSM8K / HumanEval / arith accuracy with the top-K sinks masked (paper Table 1)",
                       description=__doc__)
    # one flag per `param` field of EvalConfig (type, range, help and default from the field)
    add_config_flags(p, EvalConfig)
    # the fields that are not one `param` value: mask_topk (a list of counts or shares), the
    # sampler fields (sampler_args) and progress (--quiet)
    p.add_argument("--json", action="store_true", help="print one JSON line instead of the summary table: the "
                   "summary files and, per run, its folder, K, control, n, accuracy and SE (and log-likelihoods)")
    p.add_argument("--mask-topk", type=k_list, default=EvalConfig.mask_topk, metavar="K[,K...]",
                   help="K sinks per (layer, head), e.g. 0,1,5,10 (0 = unmasked; default 0) or shares of the "
                        "sequence, e.g. 1%%,5%%")
    # every other sampler field, over the task preset (steps = gen length, LLaDA blocks of 32, ...);
    # --eps is an old spelling of Eq. 3's --mask-eps here, so Dream's --time-eps does not take it
    p.set_defaults(func=_eval, sampler_fields=add_sampler_flags(
        p, exclude=("gen_length", "max_new_tokens", "eps"),
        title=sampler_title("sampler arguments over the task preset (only those of the model's sampler are accepted)",
                            "eval", sampler), only=sampler))


def config_kwargs(args) -> dict:
    """EvalConfig's fields from the parsed flags: its `param` fields, --mask-topk, the sampler
    flags (sampler_args) and --quiet (progress)."""
    from sinklens.eval.config import EvalConfig

    return dict(flag_values(EvalConfig, args), mask_topk=args.mask_topk, progress=args.progress,
                sampler_args=sampler_args(args, args.sampler_fields))


def _eval(args) -> int:
    from sinklens.cli import precheck
    from sinklens.cli.logs import note
    from sinklens.eval.config import EvalConfig
    from sinklens.eval.dist import env_world
    from sinklens.eval.rundir import RunDirBusy
    from sinklens.eval.tasks import get_task

    # the settings, the model's name, the data: all checked before torch is imported
    cfg = EvalConfig(**config_kwargs(args))
    if "threshold" in cfg.sampler_args:
        note("note: --threshold is the sampler's commit threshold (LLaDA2, Fast-dLLM), as in generate and trace; "
             "the masking threshold, which --threshold set in eval before, is --mask-threshold")
    precheck.model_name(cfg.model)
    precheck.dtype(cfg.dtype)
    precheck.sampler_flags(cfg.sampler_args)
    get_task(cfg.task).check_source(cfg.data)
    try:
        cfg.sandbox_config()        # HumanEval: a sandbox this machine can give, before any model loads
    except SandboxUnavailable as e:
        raise CliError(str(e)) from None
    precheck.model_sampler(cfg.model, cfg.sampler, cfg.sampler_args, task=cfg.task, gen_length=cfg.gen_length,
                           generates="there is nothing to evaluate; trace it with `sinklens trace` instead")
    from sinklens.eval.runner import run_eval
    try:  # bad input raises before anything is written; a failed write (OSError) says what was kept
        run_dirs = run_eval(cfg)
    except RunDirBusy as e:  # another process writes the same run: an input problem (exit 2)
        raise CliError(str(e)) from None
    except KeyboardInterrupt:
        print(f"sinklens eval: interrupted; the finished samples are kept in {args.out}: the same command "
              "resumes from them", file=sys.stderr)
        return 130
    summary = os.path.join(args.out, "summary.md")
    if args.json and env_world()[0] == 0:
        from sinklens.cli.logs import print_json
        from sinklens.eval.summary import headline

        print_json({"out": args.out, "summary_md": summary, "summary_csv": os.path.join(args.out, "summary.csv"),
                    "runs": [headline(d) for d in run_dirs]})
    elif env_world()[0] == 0 and os.path.isfile(summary):    # rank 0 writes the summary
        with open(summary) as f:
            print(f.read())
        runs = sorted({os.path.join(os.path.dirname(d), "k<K>") for d in run_dirs}) or [args.out]  # one per model
        print(f"wrote {summary} and summary.csv; each run's samples and settings in "
              f"{', '.join(r + '/' for r in runs)} (docs/evaluation.md)")
    return 0
