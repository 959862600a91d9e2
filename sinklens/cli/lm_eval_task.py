"""`sinklens lm-eval-task --data PATH --out DIR`: write the GSM8K chain-of-thought lm-eval task
(`sinklens_gsm8k_cot.yaml`) reading a local JSONL by its absolute path, so lm-eval finds the data
from any working directory:

    sinklens lm-eval-task --data /path/to/gsm8k/test.jsonl --out tasks/
    sinklens-lm-eval --model sinklens --model_args pretrained=smollm2-135m-instruct,mask_k=1 --device cpu \\
        --tasks sinklens_gsm8k_cot --include_path tasks/ --limit 1

The model must take GSM8K's 8-shot prompt (~1900 tokens): SmolLM2-135M-Instruct does, the tiny
twins (context 128 / 384) do not (docs/evaluation.md, "lm-eval-harness").
"""
from __future__ import annotations

import os


def run(args) -> int:
    from sinklens.eval.lm_eval_task import write_task_yaml

    data = os.path.abspath(os.path.expanduser(args.data))
    if not os.path.isfile(data):
        raise FileNotFoundError(2, "no such data file (expected GSM8K test.jsonl lines)", data)
    if os.path.exists(args.out) and not os.path.isdir(args.out):
        raise NotADirectoryError(20, "--out is a file; expected a folder", args.out)
    from sinklens.cli.types import CliError
    from sinklens.eval import gsm8k

    items, errors = gsm8k.load(data)     # lm-eval would fail on it only once the model is loaded
    if not items:
        why = f" ({errors[0]})" if errors else ""
        raise CliError(f"--data {args.data}: no GSM8K problem (a {{\"question\", \"answer\"}} line){why}")
    path = write_task_yaml(args.out, data)
    print(path)
    return 0


def register(sub) -> None:
    p = sub.add_parser("lm-eval-task", help="write the GSM8K lm-eval task YAML for a local data file",
                       description=__doc__)
    p.add_argument("--data", required=True, help="GSM8K test.jsonl (question / answer lines)")
    p.add_argument("--out", required=True, help="folder for sinklens_gsm8k_cot.yaml (lm-eval --include_path)")
    p.set_defaults(func=run)
