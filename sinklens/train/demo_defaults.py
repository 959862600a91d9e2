"""The shipped tiny twins' settings: their task, the sampler behind docs/training.md, the demo.

Everything is read from the twins' own `training/train_config.json`, so the demo, the eval task
and the tests always match the weights that are shipped. The weights are stored in float16;
they are run in float32 (what they were trained and scored in).
"""
from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

from sinklens.train.data import DataConfig, generate

ASSETS = Path(__file__).resolve().parents[1] / "assets"
LOAD = {"dtype": "float32"}


@lru_cache(maxsize=1)
def twin_train_config() -> dict:
    """The DLM twin's training config ({} when the twins are not shipped)."""
    conf = ASSETS / "tiny-dlm" / "training" / "train_config.json"
    return json.loads(conf.read_text()) if conf.is_file() else {}


def twin_data_config() -> DataConfig:
    data = twin_train_config().get("data")
    return DataConfig(**data) if data else DataConfig()


def gen_length() -> int:
    return int(twin_train_config().get("gen_length", 24))


def dlm_sampler() -> dict:
    """LLaDA low-confidence remasking, temperature 0, one token per step, semi-AR blocks."""
    g = gen_length()
    return {"steps": g, "gen_length": g, "block_length": int(twin_train_config().get("block_length") or g),
            "temperature": 0.0, "remasking": "low_confidence"}


def arm_sampler() -> dict:
    return {"max_new_tokens": gen_length(), "do_sample": False}


def heldout_problems(n: int, seed: int = 0):
    """Problems whose number combinations never occur in the twins' training data."""
    return generate(n, seed=seed, split="heldout", cfg=twin_data_config())


def heldout_prompt(index: int = 0) -> str:
    return heldout_problems(index + 1)[index].question


def demo_models_and_prompt():
    from sinklens.demo import DemoModel
    return ([DemoModel("tiny-dlm", "tiny-dlm", dlm_sampler(), dict(LOAD)),
             DemoModel("tiny-arm", "tiny-arm", arm_sampler(), dict(LOAD))], heldout_prompt())
