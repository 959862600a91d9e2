"""Sampler configs and the sampler registry: the one place a sampler's parameters are written.

A sampler is a config dataclass (this file) plus a `sample(model, input_ids, config, ...)`
function (its own module, e.g. `sinklens/samplers/llada.py`), registered by name:

    @register("llada", module="sinklens.samplers.llada")
    @dataclass
    class LLaDAConfig(SamplerConfig):
        steps: int = param(128, int, "denoising steps", min=1)
        ...

Each field's metadata holds its parse type, help text and range; `__post_init__` checks every
field against it (one message format everywhere), then `check()` adds the rules between fields.
Everything else reads these fields: `model.generate(**kwargs)` (`from_kwargs`), the command line
flags (`add_sampler_flags`), the eval presets (`for_task`), lm-eval model args
and the trace metadata (`to_dict`).

This module imports neither torch nor transformers, so the command line can build its flags
(and answer --help) without them.
"""
from __future__ import annotations

import importlib
from dataclasses import MISSING, asdict, dataclass, fields, replace
from typing import Any, Callable, ClassVar

from sinklens.params import check_fields, check_value, expected, param, parse_text  # noqa: F401 (re-exported)


@dataclass
class SamplerConfig:
    """Base of every sampler config. Subclasses are dataclasses of `param` fields."""

    name: ClassVar[str] = ""  # registry name, set by @register
    module: ClassVar[str] = ""  # module holding `sample(model, input_ids, config, ...)`
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


SAMPLERS: dict[str, type[SamplerConfig]] = {}


def register(name: str, module: str) -> Callable[[type], type]:
    """Class decorator: register a config class as sampler `name`, whose `sample` lives in `module`."""
    def deco(cls):
        cls.name, cls.module = name, module
        SAMPLERS[name] = cls
        return cls
    return deco


def get_config(name: str) -> type[SamplerConfig]:
    if name not in SAMPLERS:
        raise ValueError(f"unknown sampler {name!r}; known: {sorted(SAMPLERS)}")
    return SAMPLERS[name]


def get_sample(name: str) -> Callable[..., Any]:
    """The `sample` function of sampler `name` (imports its module, and so torch)."""
    return importlib.import_module(get_config(name).module).sample


# --- the samplers ---------------------------------------------------------------------------------


@register("llada", module="sinklens.samplers.llada")
@dataclass
class LLaDAConfig(SamplerConfig):
    """LLaDA / MMaDA `generate()` (LLaDA's generate.py); defaults as the official function."""

    length_field: ClassVar[str] = "gen_length"
    TASK_LENGTHS: ClassVar[dict] = {"gsm8k": 256, "humaneval": 512}

    steps: int = param(128, int, "denoising steps (a multiple of the number of blocks)", min=1)
    gen_length: int = param(128, int, "tokens to generate (a multiple of block_length)", min=1)
    block_length: int = param(128, int, "semi-autoregressive block length", min=1)
    temperature: float = param(0.0, float, "Gumbel sampling temperature (0 = greedy)", min=0)
    cfg_scale: float = param(0.0, float, "classifier-free guidance scale (0 = off)", min=0)
    remasking: str = param("low_confidence", str, "which masked positions are revealed first",
                           choices=("low_confidence", "random"))
    mask_id: int | None = param(None, int, "mask token id (default: the model's)", min=0)
    logits_eos_inf: bool = param(False, bool, "never sample EOS")
    confidence_eos_eot_inf: bool = param(False, bool, "EOS / EoT get no confidence")

    def check(self) -> None:
        if self.gen_length % self.block_length:
            raise ValueError(f"gen_length ({self.gen_length}) must be a multiple of block_length ({self.block_length})")
        if self.steps % self.num_blocks:
            raise ValueError(f"steps ({self.steps}) must be divisible by the number of blocks "
                             f"(gen_length / block_length = {self.num_blocks})")

    @property
    def num_blocks(self) -> int:
        return self.gen_length // self.block_length

    @classmethod
    def preset(cls, length: int) -> dict:
        # blocks of 32 (the paper's setting), steps = gen length (one token per step: LLaDA's FAQ)
        return dict(gen_length=length, steps=length, block_length=min(32, length), temperature=0.0, cfg_scale=0.0,
                    remasking="low_confidence")

    @classmethod
    def round_length(cls, length: int, **overrides) -> int:
        block = overrides.get("block_length") or min(32, length)
        return -(-length // block) * block  # whole blocks

    @classmethod
    def trained_settings(cls, train: dict) -> dict:
        g = int(train["gen_length"])  # one token per step; the twin's eval block (0 = the whole answer)
        return dict(gen_length=g, steps=g, block_length=int(train.get("block_length") or g), temperature=0.0,
                    remasking="low_confidence")

    @classmethod
    def with_length(cls, settings: dict, n: int) -> dict:
        d = {**cls.defaults(), **settings}
        block = d["block_length"] if n % d["block_length"] == 0 else n  # else one block
        per_block = max(1, d["steps"] // max(1, d["gen_length"] // d["block_length"]))
        steps = n if d["steps"] == d["gen_length"] else per_block * (n // block)
        return {**settings, "gen_length": n, "block_length": block, "steps": steps}

    @classmethod
    def fit_length(cls, settings: dict, room: int) -> int:
        block = settings.get("block_length", cls.defaults()["block_length"])
        return room // block * block if room >= block else room  # whole blocks


@register("dream", module="sinklens.samplers.dream")
@dataclass
class DreamConfig(SamplerConfig):
    """Dream `diffusion_generate()`; defaults as Dream's generation config, except max_new_tokens."""

    TASK_LENGTHS: ClassVar[dict] = {"gsm8k": 256, "humaneval": 768}

    steps: int = param(512, int, "denoising steps", min=1)
    max_new_tokens: int = param(128, int, "tokens to generate", min=1)
    eps: float = param(1e-3, float, "final time of the schedule", gt=0, lt=1)
    alg: str = param("origin", str, "which masked positions are revealed",
                     choices=("origin", "maskgit_plus", "topk_margin", "entropy"))
    alg_temp: float | None = param(None, float, "temperature of the position sampling (None/0 = top-k)", min=0)
    temperature: float = param(0.0, float, "token sampling temperature (0 = greedy)", min=0)
    top_p: float | None = param(None, float, "nucleus sampling mass", gt=0, max=1)
    top_k: int | None = param(None, int, "sample among the top-k tokens", min=1)
    mask_id: int | None = param(None, int, "mask token id (default: the model's)", min=0)

    @classmethod
    def preset(cls, length: int) -> dict:
        # Dream's evaluation settings: steps = gen length, entropy order, T 0.1, top-p 0.9
        return dict(max_new_tokens=length, steps=length, temperature=0.1, top_p=0.9, alg="entropy", alg_temp=0.0)

    @classmethod
    def trained_settings(cls, train: dict) -> dict:
        g = int(train["gen_length"])  # the dlm-shift twins' scoring: confidence order, greedy
        return dict(max_new_tokens=g, steps=g, temperature=0.0, alg="maskgit_plus", alg_temp=0.0)


@register("arm", module="sinklens.samplers.arm")
@dataclass
class ARMConfig(SamplerConfig):
    """Autoregressive decoding with a KV cache (transformers' generate order); greedy by default."""

    TASK_LENGTHS: ClassVar[dict] = {"gsm8k": 256, "humaneval": 512}

    max_new_tokens: int = param(32, int, "tokens to generate", min=1)
    do_sample: bool = param(False, bool, "sample instead of greedy")
    temperature: float = param(1.0, float, "sampling temperature (with do_sample)", min=0)
    top_p: float | None = param(None, float, "nucleus sampling mass", gt=0, max=1)
    top_k: int | None = param(None, int, "sample among the top-k tokens", min=1)
    eos_token_id: int | list[int] | None = param(None, "ids", "stop token id(s) (default: the model's)")

    @classmethod
    def preset(cls, length: int) -> dict:
        return dict(max_new_tokens=length, do_sample=False)  # greedy

    def check(self) -> None:
        if self.do_sample and not self.temperature > 0:
            raise ValueError(f"do_sample=True needs temperature > 0, got {self.temperature}")


@register("encoder", module="sinklens.samplers.encoder")
@dataclass
class EncoderConfig(SamplerConfig):
    """BERT / ModernBERT: one forward pass recorded as a one-step trace; nothing to set."""

    length_field: ClassVar[str] = ""  # generates nothing
    generates: ClassVar[bool] = False

    @classmethod
    def preset(cls, length: int) -> dict:
        return {}

    @property
    def length(self) -> int:
        return 0


@register("diffusion_gemma", module="sinklens.samplers.diffusion_gemma")
@dataclass
class DiffusionGemmaSamplerConfig(SamplerConfig):
    """DiffusionGemma's `generate()` (transformers' generation_diffusion_gemma.py): canvases of random
    tokens, entropy-bound acceptance, linear temperature schedule, stable-and-confident stopping.
    None = the checkpoint's generation_config.json value, else transformers' default (`DEFAULTS`)."""

    DEFAULTS: ClassVar[dict] = dict(max_new_tokens=256, max_denoising_steps=48, entropy_bound=0.1, t_min=0.4,
                                    t_max=0.8, stability_threshold=1, confidence_threshold=0.005)

    max_new_tokens: int | None = param(None, int, "tokens to generate (rounded up to whole canvases)", min=1)
    max_denoising_steps: int | None = param(None, int, "denoising steps per canvas (at most)", min=1)
    entropy_bound: float | None = param(None, float, "accept the lowest-entropy tokens while their summed "
                                        "entropy minus the largest stays within this bound", gt=0)
    t_min: float | None = param(None, float, "temperature at the last denoising step", min=0)
    t_max: float | None = param(None, float, "temperature at the first denoising step", min=0)
    stability_threshold: int | None = param(None, int, "stop a canvas once its argmax held this many steps", min=0)
    confidence_threshold: float | None = param(None, float, "... and its mean entropy is below this", gt=0)
    eos_token_id: int | list[int] | None = param(None, "ids", "stop token id(s) (default: the checkpoint's)")
    pad_token_id: int | None = param(None, int, "fills a finished row (default: the checkpoint's)", min=0)

    def check(self) -> None:
        if self.t_min is not None and self.t_max is not None and not self.t_max > self.t_min:
            raise ValueError(f"t_max must be > t_min, got t_min={self.t_min}, t_max={self.t_max}")

    @property
    def length(self) -> int:
        return self.max_new_tokens or self.DEFAULTS["max_new_tokens"]
