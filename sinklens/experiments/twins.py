"""The shipped tiny twins' presets: the sampler settings behind docs/training.md and the demo.

The task and its data settings (the twins' own `training/train_config.json`) live with the eval
task in `sinklens.eval.arith`, so the demo, the eval task and the tests always match the weights
that are shipped. The weights are stored in float16; they are run in float32 (what they were
trained and scored in).
"""
from __future__ import annotations

from sinklens.eval.arith import heldout_problems, twin_train_config
from sinklens.experiments.demo_model import DemoModel
from sinklens.samplers import lengths
from sinklens.samplers.arm import ARMConfig
from sinklens.samplers.llada import LLaDAConfig

LOAD = {"dtype": "float32"}


def dlm_sampler() -> dict:
    """LLaDA low-confidence remasking, temperature 0, one token per step, the twin's eval blocks
    (the length policy's settings for the twin, as `sinklens generate` / `eval` run it)."""
    return lengths.settings(LLaDAConfig, lengths.ModelFacts(train=twin_train_config())).values


def arm_sampler() -> dict:
    return lengths.settings(ARMConfig, lengths.ModelFacts(train=twin_train_config())).values


def heldout_prompt(index: int = 0) -> str:
    return heldout_problems(index + 1)[index].question


def demo_models_and_prompt():
    return ([DemoModel("tiny-dlm", "tiny-dlm", dlm_sampler(), dict(LOAD)),
             DemoModel("tiny-arm", "tiny-arm", arm_sampler(), dict(LOAD))], heldout_prompt())
