"""The embedded default of `sinklens demo`: the shipped tiny twins on one held-out problem.

Sampler settings are the ones behind the held-out accuracies in docs/training.md. The weights
are stored in float16; they are run in float32 (what they were trained and scored in).
"""
from __future__ import annotations

from sinklens.train.data import generate

DLM_SAMPLER = {"steps": 24, "gen_length": 24, "block_length": 8, "temperature": 0.0,
               "remasking": "low_confidence"}
ARM_SAMPLER = {"max_new_tokens": 24, "do_sample": False}
LOAD = {"dtype": "float32"}


def heldout_prompt(index: int = 0) -> str:
    """A problem whose number combination never occurs in training (seed 0 held-out split)."""
    return generate(index + 1, seed=0, split="heldout")[index].question


def demo_models_and_prompt():
    from sinklens.demo import DemoModel
    return ([DemoModel("tiny-dlm", "tiny-dlm", dict(DLM_SAMPLER), dict(LOAD)),
             DemoModel("tiny-arm", "tiny-arm", dict(ARM_SAMPLER), dict(LOAD))], heldout_prompt())
