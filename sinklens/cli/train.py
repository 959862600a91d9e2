"""`sinklens train`: train a tiny masked diffusion LM (LLaDA recipe), its autoregressive twin, or a
Dream-style DLM from an ARM, on synthetic arithmetic word problems (sinklens.train.train).
Resumes from <out>/ckpt. The flags are the `param` fields of TrainConfig, ModelConfig
(sinklens/train/config.py) and DataConfig (sinklens/train/data.py), built by
sinklens/cli/fields.py: a new setting is a new field there.

    sinklens train --kind dlm --out runs/dlm
    sinklens train --kind dlm-shift --init-from runs/arm --out runs/dlm-from-arm
"""
from __future__ import annotations

import argparse

from sinklens.cli.fields import add_config_flags, flag_values


def register(sub) -> None:
    from sinklens.train.config import ModelConfig, TrainConfig
    from sinklens.train.data import DataConfig

    p = sub.add_parser("train", help="train a tiny DLM (LLaDA-style) or its ARM twin", description=__doc__)
    add_config_flags(p.add_argument_group("run (TrainConfig)"), TrainConfig, required=("kind", "out"))
    add_config_flags(p.add_argument_group("model shape (ModelConfig)"), ModelConfig)
    add_config_flags(p.add_argument_group("problems (DataConfig)"), DataConfig)
    p.set_defaults(func=run)


def config(args: argparse.Namespace):
    """The TrainConfig the parsed flags describe (its checks raise ValueError naming the field)."""
    from sinklens.train.config import ModelConfig, TrainConfig
    from sinklens.train.data import DataConfig

    return TrainConfig(**flag_values(TrainConfig, args), model=ModelConfig(**flag_values(ModelConfig, args)),
                       data=DataConfig(**flag_values(DataConfig, args)))


def run(args: argparse.Namespace) -> int:
    from sinklens.train.train import train

    res = train(config(args), progress=args.progress)
    if res["finished"]:
        print(f"done: {res['step']} steps, exported to {res['out']}/export")
    else:
        print(f"stopped after step {res['step']} (checkpoint in {res['out']}/ckpt); run again to resume")
    return 0
