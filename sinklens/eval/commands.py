"""`sinklens eval` and `sinklens eval-summary` (argparse only; the work is in runner / summary)."""
from __future__ import annotations

import argparse
import os
import sys

from sinklens.cliargs import finite_float, nonneg_int, positive_float, positive_int
from sinklens.samplers.command import add_sampler_flags, sampler_args


def _k_list(s: str) -> tuple[int | str, ...]:
    from sinklens.eval.runner import parse_k
    try:
        return tuple(parse_k(x) for x in s.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated K values like 0,1,5,10 or 1%,5%, got {s!r}") from None


def register(sub) -> None:
    p = sub.add_parser("eval", help="GSM8K / HumanEval accuracy with the top-K sinks masked (paper Table 1)")
    p.add_argument("--model", required=True, help="alias, local folder, .gguf or hub id")
    p.add_argument("--task", required=True, help="gsm8k | humaneval")
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
    p.add_argument("--data", default=None, help="local JSONL (GSM8K test.jsonl / HumanEval problems)")
    p.add_argument("--out", required=True, help="output directory (re-running resumes)")
    p.add_argument("--shots", type=nonneg_int, default=8, help="GSM8K chain-of-thought exemplars (0 = zero-shot)")
    p.add_argument("--chat", choices=["auto", "on", "off"], default="auto", help="use the chat template")
    p.add_argument("--gen-length", type=positive_int, default=None,
                   help="tokens to generate, any sampler (default: the paper's setting for the task and family)")
    p.add_argument("--ranking", choices=["per_head", "global"], default="per_head")
    p.add_argument("--threshold", type=positive_float, default=None, help="block keys with r_j >= this instead of top-K")
    p.add_argument("--keep-self", action="store_true", help="a blocked key still receives its own query's attention")
    p.add_argument("--step0", choices=["unmasked", "probe"], default="unmasked")
    p.add_argument("--arm-rule", choices=["newest", "prefix"], default="newest")
    p.add_argument("--no-loglik", action="store_true", help="skip the reference-answer log-likelihood")
    p.add_argument("--sandbox-timeout", type=positive_float, default=10.0, help="seconds per HumanEval check")
    p.add_argument("--seed", type=nonneg_int, default=0)
    p.add_argument("--dtype", default=None)
    p.add_argument("--device", default=None)
    p.add_argument("--no-progress", action="store_true")
    # every other sampler field, over the task preset (steps = gen length, LLaDA blocks of 32, ...);
    # --eps is Eq. 3's margin here, so Dream's schedule end keeps its default (EvalConfig.sampler_args sets it)
    p.set_defaults(func=_eval, sampler_fields=add_sampler_flags(
        p, exclude=("gen_length", "max_new_tokens", "eps"),
        title="sampler arguments over the task preset (only those of the model's sampler are accepted)"))

    s = sub.add_parser("eval-summary", help="Table-1 style summary (markdown + CSV) of eval output directories")
    s.add_argument("dirs", nargs="+", help="eval output directories (several models side by side)")
    s.add_argument("--out", default=None, help="where summary.md / summary.csv go (default: the first dir)")
    s.set_defaults(func=_summary)


def _eval(args) -> int:
    from sinklens.eval.rundir import RunDirBusy
    from sinklens.eval.runner import EvalConfig, dist_rank_world, run_eval
    try:
        cfg = EvalConfig(model=args.model, task=args.task, out=args.out, mask_topk=args.mask_topk,
                         limit=args.limit, data=args.data, shots=args.shots, chat=args.chat,
                         gen_length=args.gen_length, sampler_args=sampler_args(args, args.sampler_fields),
                         seed=args.seed, dtype=args.dtype, device=args.device, ranking=args.ranking,
                         mask_sinks=args.mask_sinks, eps=args.eps, mask_units=args.mask_units,
                         mask_scope=args.mask_scope, mask_control=args.mask_control,
                         threshold=args.threshold, keep_self=args.keep_self, step0=args.step0,
                         arm_rule=args.arm_rule, loglik=not args.no_loglik,
                         sandbox_timeout=args.sandbox_timeout, progress=not args.no_progress)
        run_eval(cfg)
    except (ValueError, FileNotFoundError, RunDirBusy) as e:     # bad input: nothing was written
        print(f"sinklens eval: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:              # disk full, file-size limit, ...: the message says what was kept
        print(f"sinklens eval: error: {e}", file=sys.stderr)
        return 1
    summary = os.path.join(args.out, "summary.md")
    if dist_rank_world()[0] == 0 and os.path.isfile(summary):    # rank 0 writes the summary
        with open(summary) as f:
            print(f.read())
    return 0


def _summary(args) -> int:
    from sinklens.eval.summary import write_summary
    try:
        md, _ = write_summary(args.dirs, args.out or args.dirs[0])
    except FileNotFoundError as e:
        print(f"sinklens eval-summary: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"sinklens eval-summary: error: {e}", file=sys.stderr)
        return 1
    print(md)
    return 0
