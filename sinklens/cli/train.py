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
import json
import sys
from pathlib import Path

from sinklens.cli.fields import add_config_flags, flag_values
from sinklens.cli.types import CliError
from sinklens.runlock import RunDirBusy


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

    cfg = config(args)
    try:
        res = train(cfg, progress=args.progress)
    except RunDirBusy as e:     # another training writes this --out: an input problem (exit 2)
        raise CliError(str(e)) from None
    except KeyboardInterrupt:   # what is kept is the last checkpoint: say which, and that the same command resumes
        print(f"sinklens train: interrupted; {_kept(Path(cfg.out) / 'ckpt', cfg.ckpt_every)}", file=sys.stderr)
        return 130
    if res["finished"]:
        print(f"done: {res['step']} steps, exported to {res['out']}/export")
    else:
        print(f"stopped after step {res['step']} (checkpoint in {res['out']}/ckpt); run again to resume")
    return 0


def _kept(ckpt: Path, every: int) -> str:
    """What an interrupted training run keeps: its last checkpoint (written every `every` steps)."""
    try:
        step = json.loads((ckpt / "state.json").read_text())["step"]
    except (OSError, ValueError, KeyError):
        return f"no checkpoint yet (one is written every {every} steps, --ckpt-every): the same command starts over"
    return (f"the checkpoint of step {step} is in {ckpt} (one every {every} steps, --ckpt-every): the same "
            "command resumes from it")

