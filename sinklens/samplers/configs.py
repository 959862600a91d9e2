"""The sampler config base class and the sampler registry.

A sampler is one module of this package (e.g. `sinklens/samplers/llada.py`) holding a config
dataclass, the one place its parameters are written, and a `sample(model, input_ids, config, ...)`
function; the config registers itself by name:

    @register("llada")
    @dataclass
    class LLaDAConfig(SamplerConfig):
        steps: int = param(128, int, "denoising steps", min=1)
        ...

Each field's metadata holds its parse type, help text and range; `__post_init__` checks every
field against it (one message format everywhere), then `check()` adds the rules between fields.
Everything else reads these fields: `model.generate(**kwargs)` (`from_kwargs`), the command line
flags (`add_sampler_flags`), the eval presets (`for_task`), lm-eval model args
and the trace metadata (`to_dict`).

The registry finds the built-in samplers itself: the first read of `SAMPLERS` (or `get_config`)
imports every module of `sinklens.samplers` but the infrastructure ones (`base`, `configs`,
`defaults`, `_private`), and their `@register` lines run. A new sampler is one new file; nothing
here lists it. A sampler defined outside sinklens registers the same way once its module is
imported. Neither this module nor a sampler module imports torch or transformers when imported
(the samplers bind them with `sinklens._lazy.lazy`), so the command line builds its flags (and
answers --help) without them.
"""
from __future__ import annotations

import importlib
from collections.abc import MutableMapping
from dataclasses import MISSING, asdict, dataclass, fields, replace
from typing import Any, Callable, ClassVar

from sinklens._lazy import PackageRegistry
from sinklens.params import check_fields, check_value, expected, param, parse_text  # noqa: F401 (re-exported)


@dataclass
class SamplerConfig:
    """Base of every sampler config. Subclasses are dataclasses of `param` fields."""

    name: ClassVar[str] = ""  # registry name, set by @register
    module: ClassVar[str] = ""  # module holding `sample(model, input_ids, config, ...)`: the class's own
    length_field: ClassVar[str] = "max_new_tokens"  # the field that says how many tokens to generate
    generates: ClassVar[bool] = True  # False: one forward pass, no text out (encoders); eval refuses it
    TASK_LENGTHS: ClassVar[dict] = {}  # task -> the paper's generation length for this sampler

    def __post_init__(self):
        check_fields(self)
        self.check()

    def check(self) -> None:
        """Rules between fields (override); single fields are checked from their metadata."""

    @classmethod
    def from_kwargs(cls, **kwargs) -> "SamplerConfig":
        """The config from official argument names; an unknown name is a TypeError naming the sampler."""
        known = [f.name for f in fields(cls)]
        unknown = sorted(set(kwargs) - set(known))
        if unknown:
            raise TypeError(f"the {cls.name} sampler got unknown argument(s) {unknown}; it takes {known}")
        return cls(**kwargs)

    @classmethod
    def task_settings(cls, task: str | None = None, length: int | None = None, **overrides) -> dict:
        """The paper's settings for `task` (SPEC §6) with `length` tokens to generate (None: the
        task's length for this sampler), then `overrides` by field name; unchecked keywords."""
        if length is None:
            length = cls.TASK_LENGTHS.get(task) if task else None
        return {**(cls.preset(length) if length is not None else {}), **overrides}

    @classmethod
    def for_task(cls, task: str | None = None, length: int | None = None, **overrides) -> "SamplerConfig":
        """`task_settings` as a checked config."""
        return cls.from_kwargs(**cls.task_settings(task, length, **overrides))

    @classmethod
    def round_length(cls, length: int, **overrides) -> int:
        """The smallest length >= `length` this sampler can generate with `overrides` (override)."""
        return length

    @classmethod
    def preset(cls, length: int) -> dict:
        """Evaluation settings for a generation of `length` tokens (override per sampler)."""
        return {cls.length_field: length}

    @classmethod
    def paper_settings(cls) -> dict:
        """What runs when the model says nothing: the paper's GSM8K setting (SPEC §6), else the defaults."""
        length = cls.TASK_LENGTHS.get("gsm8k")
        return cls.preset(length) if length else {}

    @classmethod
    def trained_settings(cls, train: dict) -> dict:
        """The settings a sinklens-trained model was scored with (`train`: its train_config.json)."""
        return cls.preset(int(train["gen_length"]))

    @classmethod
    def with_length(cls, settings: dict, n: int) -> dict:
        """`settings` generating `n` tokens; steps follow the length when they equalled it (override)."""
        old = settings.get(cls.length_field, cls.defaults()[cls.length_field])
        out = {**settings, cls.length_field: n}
        if "steps" in cls.defaults() and settings.get("steps", cls.defaults()["steps"]) == old:
            out["steps"] = n
        return out

    @classmethod
    def fit_length(cls, settings: dict, room: int) -> int:
        """The longest length <= `room` this sampler can generate with `settings` (override)."""
        return room

    @property
    def length(self) -> int:
        """Tokens this config generates."""
        return getattr(self, self.length_field)

    def replace(self, **changes) -> "SamplerConfig":
        return replace(self, **changes)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def defaults(cls) -> dict:
        return {f.name: f.default for f in fields(cls) if f.default is not MISSING}


# name -> config class. The first read imports every module of this package but the infrastructure
# named here (and `_private` ones): each sampler module registers its config while imported.
SAMPLERS: MutableMapping[str, type[SamplerConfig]] = PackageRegistry(__package__, skip=("base", "configs", "defaults"))


def register(name: str) -> Callable[[type], type]:
    """Class decorator: register a config class as sampler `name`; its module holds `sample`."""
    def deco(cls):
        cls.name, cls.module = name, cls.__module__
        SAMPLERS[name] = cls
        return cls
    return deco


def get_config(name: str) -> type[SamplerConfig]:
    if name not in SAMPLERS:
        raise ValueError(f"unknown sampler {name!r}; known: {sorted(SAMPLERS)}")
    return SAMPLERS[name]


def get_sample(name: str) -> Callable[..., Any]:
    """The `sample` function of sampler `name` (its module is imported; torch on the first call)."""
    return importlib.import_module(get_config(name).module).sample
