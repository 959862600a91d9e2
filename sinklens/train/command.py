"""`sinklens train`: argument parsing for sinklens.train.train.train (nothing else)."""
from __future__ import annotations

import argparse
from dataclasses import fields

from sinklens.train.data import DataConfig
from sinklens.train.model import ModelConfig


def register(sub) -> None:
    p = sub.add_parser("train", help="train a tiny DLM (LLaDA-style) or its ARM twin",
                       description="Train a tiny masked diffusion LM or its autoregressive twin on "
                                   "synthetic arithmetic word problems. Resumes from <out>/ckpt.")
    p.add_argument("--kind", choices=["dlm", "arm", "dlm-shift"], required=True,
                   help="dlm: LLaDA recipe; arm: next-token twin; dlm-shift: Dream's recipe (position i-1 "
                        "predicts masked token i), usually with --init-from an ARM run")
    p.add_argument("--init-from", default="", help="start from this run folder's checkpoint weights")
    p.add_argument("--out", required=True, help="run folder (checkpoints, log, curves, export/)")
    for name, typ, default in [("seed", int, 0), ("steps", int, 3000), ("stop-after", int, 0), ("batch-size", int, 64),
                               ("lr", float, 2e-3), ("min-lr-frac", float, 0.1), ("warmup", int, 100),
                               ("weight-decay", float, 0.01), ("grad-clip", float, 1.0), ("gen-length", int, 24),
                               ("block-length", int, 0), ("log-every", int, 25),
                               ("eval-every", int, 500), ("eval-n", int, 200), ("ckpt-every", int, 100),
                               ("vocab-size", int, 256)]:
        p.add_argument(f"--{name}", type=typ, default=default)
    for f in fields(ModelConfig):
        if f.name != "vocab_size":
            p.add_argument(f"--{f.name.replace('_', '-')}", type=int, default=f.default)
    for f in fields(DataConfig):
        p.add_argument(f"--{f.name.replace('_', '-')}", type=type(f.default), default=f.default)
    p.add_argument("--no-progress", action="store_true", help="no tqdm bar (for log files)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from sinklens.train.train import TrainConfig, train
    model = ModelConfig(**{f.name: getattr(args, f.name) for f in fields(ModelConfig) if f.name != "vocab_size"})
    data = DataConfig(**{f.name: getattr(args, f.name) for f in fields(DataConfig)})
    cfg = TrainConfig(**{f.name: getattr(args, f.name) for f in fields(TrainConfig)
                         if f.name not in ("model", "data")}, model=model, data=data)
    res = train(cfg, progress=not args.no_progress)
    if res["finished"]:
        print(f"done: {res['step']} steps, exported to {res['out']}/export")
    else:
        print(f"stopped after step {res['step']} (checkpoint in {res['out']}/ckpt); run again to resume")
    return 0
