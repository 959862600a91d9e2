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
from sinklens.samplers.sdar.config import SDARConfig

LOAD = {"dtype": "float32"}


def dlm_sampler() -> dict:
    """LLaDA low-confidence remasking, temperature 0, one token per step, the twin's eval blocks
    (the length policy's settings for the twin, as `sinklens generate` / `eval` run it)."""
    return lengths.settings(LLaDAConfig, lengths.ModelFacts(train=twin_train_config())).values


def arm_sampler() -> dict:
    return lengths.settings(ARMConfig, lengths.ModelFacts(train=twin_train_config())).values


def dual_sampler() -> dict:
    """tiny-dual's diffusion mode: SDAR's sampler as its training config scores it (the length policy)."""
    from sinklens.samplers.lengths import training_config

    dual = DemoModel("tiny-dual", "tiny-dual")
    return lengths.settings(SDARConfig, lengths.ModelFacts(train=training_config(twin_folder(dual)))).values


def twin_folder(dm: DemoModel):
    from sinklens.eval.arith import ASSETS

    return ASSETS / dm.name


def heldout_for(dm: DemoModel, n: int) -> list:
    """`n` held-out problems of the data `dm` was trained on (each twin's own training config: a twin
    trained on other data or another tokenizer is never scored on problems it was not built for)."""
    from sinklens.eval.arith import data_config
    from sinklens.train.data import generate

    return generate(n, seed=0, split="heldout", cfg=data_config(str(twin_folder(dm))))


def matched_models() -> list[DemoModel]:
    """Table 1's four matched models: the ARM twin, the DLM twin, and tiny-dual in each of its modes
    (one set of weights; labels name the mode)."""
    return [DemoModel("tiny-arm", "tiny-arm", arm_sampler(), dict(LOAD)),
            DemoModel("tiny-dlm", "tiny-dlm", dlm_sampler(), dict(LOAD)),
            DemoModel("tiny-dual", "tiny-dual (ar)", arm_sampler(), dict(LOAD, mode="ar")),
            DemoModel("tiny-dual", "tiny-dual (diffusion)", dual_sampler(), dict(LOAD, mode="diffusion"))]


def heldout_prompt(index: int = 0) -> str:
    return heldout_problems(index + 1)[index].question


def demo_models_and_prompt():
    """The demo's models, the DLM twin first (the README's figure), and one held-out prompt."""
    arm, dlm, *dual = matched_models()
    return [dlm, arm, *dual], heldout_prompt()
