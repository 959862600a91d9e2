"""`sinklens eval`: Table-1 accuracy with the top-K sinks masked (the work is in sinklens.eval.runner).

    sinklens eval --model tiny-dlm --task arith --mask-topk 0,1,5 --limit 20 --out eval-out
    sinklens eval --model ./LLaDA-8B-Instruct --task gsm8k --data test.jsonl --mask-topk 0,1 --out out
    torchrun --nproc_per_node 2 -m sinklens.cli eval ...     # data parallel (docs/evaluation.md)
"""
from __future__ import annotations

import argparse
import os
from dataclasses import fields

from sinklens.cli.generate import add_sampler_flags, sampler_args
from sinklens.cli.types import CliError, finite_float, nonneg_int, positive_float, positive_int


def _k_list(s: str) -> tuple[int | str, ...]:
    from sinklens.eval.runner import parse_k
    try:
        return tuple(parse_k(x) for x in s.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated K values like 0,1,5,10 or 1%,5%, got {s!r}") from None


def register(sub) -> None:
    p = sub.add_parser("eval", help="GSM8K / HumanEval / arith accuracy with the top-K sinks masked (paper Table 1)",
                       description=__doc__)
    p.add_argument("--model", required=True, help="alias, local folder, .gguf or hub id")
    p.add_argument("--task", required=True,  # checked by EvalConfig (importing the task table needs torch)
                   help="gsm8k | humaneval (paper Table 1) | arith (the tiny twins' held-out problems)")
    p.add_argument("--mask-topk", type=_k_list, default=(0,),
                   help="K sinks per (layer, head), e.g. 0,1,5,10 (0 = unmasked) or shares of the sequence, e.g. 1%%,5%%")
    p.add_argument("--mask-sinks", choices=["eq3", "topk"], default="eq3",
                   help="eq3 (default): top-K among keys that pass Eq. 3, a head without a sink blocks nothing; "
                        "topk: top-K keys per head, sinks or not")
    p.add_argument("--eps", type=finite_float, default=3.0, help="Eq. 3 margin in --mask-units (default 3)")
    p.add_argument("--mask-units", choices=["scaled_sum", "uniform_ratio", "sum"], default="scaled_sum",
                   help="score units for Eq. 3: scaled_sum (default; column sums scaled so the average key "
                        "scores 1, i.e. the column sums for DLMs), uniform_ratio or sum")
    p.add_argument("--mask-scope", choices=["all", "prompt", "generated"], default="all",
                   help="which positions may be blocked (default all)")
    p.add_argument("--mask-control", choices=["none", "random"], default="none",
                   help="random: beside every masked run, block as many random non-sink keys per head (seeded)")
    p.add_argument("--limit", type=positive_int, default=None, help="first N samples only")
    p.add_argument("--data", default=None, help="local JSONL (GSM8K test.jsonl / HumanEval problems; arith: a "
                   "twin's training config)")
    p.add_argument("--out", required=True, help="output directory (re-running resumes)")
    p.add_argument("--shots", type=nonneg_int, default=8, help="GSM8K chain-of-thought exemplars (0 = zero-shot)")
    p.add_argument("--chat", choices=["auto", "on", "off"], default="auto", help="use the chat template")
    p.add_argument("--gen-length", type=positive_int, default=None,
                   help="tokens to generate, any sampler (default: the paper's setting for the task and family)")
    p.add_argument("--ranking", choices=["per_head", "global"], default="per_head",
                   help="rank sinks per (layer, head), or over all heads of a layer together")
    p.add_argument("--threshold", type=positive_float, default=None, help="block keys with r_j >= this instead of top-K")
    p.add_argument("--keep-self", action="store_true", help="a blocked key still receives its own query's attention")
    p.add_argument("--step0", choices=["unmasked", "probe"], default="unmasked",
                   help="DLM step 0 has no attention yet: run it unmasked, or rank sinks by a probe pass first")
    p.add_argument("--arm-rule", choices=["newest", "prefix"], default="newest",
                   help="ARM: rank sinks by the newest token's row, or by every prefix row")
    p.add_argument("--no-loglik", action="store_true", help="skip the reference-answer log-likelihood")
    p.add_argument("--sandbox-timeout", type=positive_float, default=10.0, help="seconds per HumanEval check")
    p.add_argument("--seed", type=nonneg_int, default=0, help="sample i uses seed + i (the same on any rank)")
    p.add_argument("--dtype", default=None, help="float32 | bfloat16 | float16 (default: as stored)")
    p.add_argument("--device", default=None, help="e.g. cpu, cuda:0 (default: the launcher's device, else cpu)")
    # every other sampler field, over the task preset (steps = gen length, LLaDA blocks of 32, ...);
    # --eps is Eq. 3's margin here, so Dream's schedule end keeps its default (EvalConfig.sampler_args sets it)
    p.set_defaults(func=_eval, sampler_fields=add_sampler_flags(
        p, exclude=("gen_length", "max_new_tokens", "eps"),
        title="sampler arguments over the task preset (only those of the model's sampler are accepted)"))


def config_kwargs(args) -> dict:
    """EvalConfig's fields from the parsed flags: a flag is named after its field (--mask-topk ->
    mask_topk); the three that are not: --no-loglik, --quiet (progress) and the sampler flags."""
    from sinklens.eval.runner import EvalConfig

    special = {"loglik": not args.no_loglik, "progress": args.progress,
               "sampler_args": sampler_args(args, args.sampler_fields)}
    return {f.name: special[f.name] if f.name in special else getattr(args, f.name) for f in fields(EvalConfig)}


def _eval(args) -> int:
    from sinklens.eval.rundir import RunDirBusy
    from sinklens.eval.dist import env_world
    from sinklens.eval.runner import EvalConfig, run_eval
    try:  # bad input raises before anything is written; a failed write (OSError) says what was kept
        cfg = EvalConfig(**config_kwargs(args))
        run_eval(cfg)
    except RunDirBusy as e:  # another process writes the same run: an input problem (exit 2)
        raise CliError(str(e)) from None
    summary = os.path.join(args.out, "summary.md")
    if env_world()[0] == 0 and os.path.isfile(summary):    # rank 0 writes the summary
        with open(summary) as f:
            print(f.read())
    return 0
