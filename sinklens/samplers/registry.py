"""The sampler registry and the config base class every sampler config extends.

A sampler is one package of this package (e.g. `sinklens/samplers/llada/`) holding a torch-free
`config.py`, the config dataclass and the one place its parameters are written, and a `sample.py`
with `sample(model, input_ids, config, ...)` (torch code). The config registers itself by name:

    @register("llada")
    @dataclass
    class LLaDAConfig(SamplerConfig):
        steps: int = param(128, int, "denoising steps", min=1)
        ...

Each field's metadata holds its parse type, help text and range; `__post_init__` checks every
field against it (one message format everywhere), then `check()` adds the rules between fields.
Everything else reads these fields: `model.generate(**kwargs)` (`from_kwargs`), the command line
flags (`add_sampler_flags`), the length policy (`sinklens.samplers.lengths`, which also reads the
class's length facts below), lm-eval model args and the trace metadata (`to_dict`).

The registry finds the built-in samplers itself: the first read of `SAMPLERS` (or `get_config`)
imports the `config` module of every subpackage of `sinklens.samplers`, and their `@register`
lines run; `get_sample` imports the sampler's `sample` module on first use. A new sampler is one
new folder; nothing here lists it. The command line reads only the configs, so --help imports no
torch.
"""
from __future__ import annotations

import importlib
import warnings
from collections.abc import MutableMapping
from dataclasses import MISSING, asdict, dataclass, fields, replace
from typing import Any, Callable, ClassVar

from sinklens._lazy import PackageRegistry
from sinklens.params import check_fields, check_value, expected, param, parse_text  # noqa: F401 (re-exported)

# Fast-dLLM's KV cache modes, an option of the llada and dream samplers (sinklens/samplers/kvcache.py)
CACHES = ("none", "prefix", "dual")


def cache_param():
    """The `cache` field of a sampler that offers Fast-dLLM's cached decoding (one declaration)."""
    return param("none", str, "Fast-dLLM KV cache: none, prefix (the prompt and finished blocks), dual (also the "
                 "masked suffix; only the block is recomputed)", choices=CACHES)


@dataclass
class SamplerConfig:
    """Base of every sampler config. Subclasses are dataclasses of `param` fields.

    The class variables are the sampler's facts that `sinklens.samplers.lengths` reads to choose
    the length, steps and block of a run (data, so the policy names no sampler)."""

    name: ClassVar[str] = ""  # registry name, set by @register
    module: ClassVar[str] = ""  # module holding the config class (set by @register)
    length_field: ClassVar[str] = "max_new_tokens"  # the field that says how many tokens to generate ("": none)
    steps_field: ClassVar[str] = ""  # denoising steps, = the length in the presets (one token per step)
    block_field: ClassVar[str] = ""  # the length must be a whole number of these (LLaDA's blocks)
    generates: ClassVar[bool] = True  # False: one forward pass, no text out (encoders); eval refuses it
    batched: ClassVar[bool] = True  # False: one prompt at a time, as the official code (callers batch by 1)
    TASK_LENGTHS: ClassVar[dict] = {}  # task -> the paper's generation length for this sampler
    PAPER: ClassVar[dict] = {}  # the paper's evaluation settings besides the length and steps (block: at most)
    TRAINED: ClassVar[dict] = {}  # how a sinklens-trained model was scored, besides length, steps and block
    RENAMED: ClassVar[dict] = {}  # old argument name -> field, still accepted with a deprecation note

    def __post_init__(self):
        check_fields(self)
        self.check()

    def check(self) -> None:
        """Rules between fields (override); single fields are checked from their metadata."""

    @classmethod
    def upgrade(cls, kwargs: dict, flags: bool = False) -> tuple[dict, list[str]]:
        """`kwargs` with old argument names (`RENAMED`) replaced by the fields, and one deprecation
        note per old name (`flags`: spelled as command-line flags)."""
        out, notes = dict(kwargs), []
        for old, new in cls.RENAMED.items():
            if old not in out:
                continue
            if new in out:
                raise TypeError(f"the {cls.name} sampler got both {old!r} and {new!r} ({old!r} is its old name)")
            out[new] = out.pop(old)
            spell = (lambda n: "--" + n.replace("_", "-")) if flags else (lambda n: n)
            notes.append(f"note: {spell(old)} of the {cls.name} sampler is deprecated; use {spell(new)}")
        return out, notes

    @classmethod
    def from_kwargs(cls, **kwargs) -> "SamplerConfig":
        """The config from official argument names (an old name warns, `RENAMED`); an unknown name is a
        TypeError naming the sampler."""
        kwargs, notes = cls.upgrade(kwargs)
        for line in notes:
            warnings.warn(line, FutureWarning, stacklevel=2)
        known = [f.name for f in fields(cls)]
        unknown = sorted(set(kwargs) - set(known))
        if unknown:
            raise TypeError(f"the {cls.name} sampler got unknown argument(s) {unknown}; it takes {known}")
        return cls(**kwargs)

    @property
    def length(self) -> int:
        """Tokens this config generates."""
        return getattr(self, self.length_field)

    def max_steps(self, prompt_length: int) -> int:
        """The most steps (forwards a hook sees) after a prompt of `prompt_length` tokens: the steps
        field, else one per new token (override where the count is another: SDAR's blocks)."""
        tokens = self.length if self.length_field else 0
        return getattr(self, self.steps_field) if self.steps_field else max(tokens or 0, 1)

    def replace(self, **changes) -> "SamplerConfig":
        return replace(self, **changes)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def defaults(cls) -> dict:
        return {f.name: f.default for f in fields(cls) if f.default is not MISSING}


# name -> config class. The first read imports `sinklens.samplers.<sampler>.config` for every
# subpackage; each registers its config while imported. Plain modules here (base, configs,
# lengths) are the infrastructure: the scan never imports them.
SAMPLERS: MutableMapping[str, type[SamplerConfig]] = PackageRegistry(__package__, submodule="config")


def register(name: str) -> Callable[[type], type]:
    """Class decorator: register a config class as sampler `name`."""
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
    """The `sample` function of sampler `name`: from the `sample` module beside its `config` module
    (a config defined in another module keeps `sample` in that module). Imports torch."""
    module = get_config(name).module
    package, _, leaf = module.rpartition(".")
    return importlib.import_module(f"{package}.sample" if leaf == "config" else module).sample
