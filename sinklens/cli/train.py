"""`sinklens train`: train a tiny masked diffusion LM (LLaDA recipe), its autoregressive twin, or a
Dream-style DLM from an ARM, on synthetic arithmetic word problems (sinklens.train.train).
Resumes from <out>/ckpt. Flags are the fields of TrainConfig, ModelConfig and DataConfig.

    sinklens train --kind dlm --out runs/dlm
    sinklens train --kind dlm-shift --init-from runs/arm --out runs/dlm-from-arm
"""
from __future__ import annotations

import argparse
from dataclasses import MISSING, fields

HELP = {  # TrainConfig / ModelConfig / DataConfig field -> help (the dataclasses keep their comments)
    "seed": "random seed (data order, initialisation)", "steps": "optimizer steps (length of the LR schedule)",
    "stop_after": "stop with a checkpoint after this step (0 = run to --steps)", "batch_size": "problems per batch",
    "lr": "peak learning rate", "min_lr_frac": "final learning rate as a share of --lr (cosine)",
    "warmup": "linear warm-up steps", "weight_decay": "AdamW weight decay", "grad_clip": "gradient norm clip",
    "gen_length": "answer region in tokens (training and eval decoding)",
    "block_length": "DLM eval decoding block (0 = the whole answer in one block)",
    "log_every": "steps between log lines", "eval_every": "steps between held-out evals",
    "eval_n": "held-out problems per eval", "ckpt_every": "steps between checkpoints",
    "vocab_size": "tokenizer vocabulary size", "n_layers": "transformer layers", "d_model": "hidden size",
    "n_heads": "attention heads", "mlp_hidden": "MLP hidden size", "max_len": "context length in tokens",
    "max_operand": "operands drawn from [1, N]", "min_ops": "fewest operations per problem",
    "max_ops": "most operations per problem", "ops": "allowed operations, e.g. +- or +-*",
    "max_value": "every intermediate result stays in [0, N]",
    "heldout_fraction": "share of operand combinations held out", "split_seed": "which combinations are held out",
    "style": "short: bare sums; story: the paper's regime (long prompts and worked answers)",
}


def _add_fields(p: argparse.ArgumentParser, dc, skip=()) -> None:
    g = p.add_argument_group(f"{dc.__name__} fields")
    for f in fields(dc):
        if f.name in skip or f.default is MISSING:
            continue
        g.add_argument(f"--{f.name.replace('_', '-')}", type=type(f.default), default=f.default,
                       help=HELP.get(f.name, f.name.replace("_", " ")))


def register(sub) -> None:
    from sinklens.train.config import ModelConfig, TrainConfig
    from sinklens.train.data import DataConfig

    p = sub.add_parser("train", help="train a tiny DLM (LLaDA-style) or its ARM twin", description=__doc__)
    p.add_argument("--kind", choices=["dlm", "arm", "dlm-shift"], required=True,
                   help="dlm: LLaDA recipe; arm: next-token twin; dlm-shift: Dream's recipe (position i-1 "
                        "predicts masked token i), usually with --init-from an ARM run")
    p.add_argument("--init-from", default="", help="start from these weights: a run folder (its checkpoint) or an exported ARM folder, e.g. sinklens/assets/story-arm-4l")
    p.add_argument("--out", required=True, help="run folder (checkpoints, log, curves, export/)")
    _add_fields(p, TrainConfig, skip=("kind", "init_from", "out", "model", "data"))
    _add_fields(p, ModelConfig, skip=("vocab_size",))
    _add_fields(p, DataConfig)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from sinklens.train.config import ModelConfig, TrainConfig
    from sinklens.train.data import DataConfig
    from sinklens.train.train import train

    model = ModelConfig(**{f.name: getattr(args, f.name) for f in fields(ModelConfig) if f.name != "vocab_size"})
    data = DataConfig(**{f.name: getattr(args, f.name) for f in fields(DataConfig)})
    cfg = TrainConfig(**{f.name: getattr(args, f.name) for f in fields(TrainConfig)
                         if f.name not in ("model", "data")}, model=model, data=data)
    res = train(cfg, progress=args.progress)
    if res["finished"]:
        print(f"done: {res['step']} steps, exported to {res['out']}/export")
    else:
        print(f"stopped after step {res['step']} (checkpoint in {res['out']}/ckpt); run again to resume")
    return 0
