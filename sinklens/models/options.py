"""Options of `sinklens.load` that are also command-line flags: `LoadOptions`.

Each `param` field is a keyword of `load()` and a flag of `sinklens generate` / `sinklens trace`
(built by `sinklens/cli/fields.py` from the field), so an option is written once, here. Imports
nothing heavy (the command line's --help reads it without torch).
"""
from __future__ import annotations

from dataclasses import dataclass

from sinklens.params import MAX_SEED, check_fields, param


@dataclass
class LoadOptions:
    random_init: int | None = param(None, int, "load the random-init control instead of the trained weights: the same "
                                               "config, shape, format and tokenizer, every weight re-initialised by "
                                               "the model class's own init under this seed (traces and corpus files "
                                               "record it)", min=0, max=MAX_SEED)

    mode: str | None = param(None, str, "the mode of a checkpoint trained in two (tiny-dual: block diffusion by "
                                        "default, 'ar' = the same weights as an autoregressive model); other "
                                        "models have one mode and refuse it")

    def __post_init__(self):
        check_fields(self)


def control_label(model: str, random_init: int | None) -> str:
    """How reports name a model that was loaded with `random_init` (the model's name alone otherwise)."""
    return model if random_init is None else f"{model} (random init, seed {random_init})"
