"""How many tokens, steps and blocks a generation gets: one policy for every caller.

Callers: the Python API (`SinkModel.generate`, `sinklens.samplers.generate`), `sinklens generate`
/ `trace`, `sinklens eval`, the lm-eval model and the twins' presets (`replicate`, the demo). Each
passes what it knows; `settings()` decides. The base, first source that applies:
  1. a sinklens-trained model (its `training/train_config.json`): the length and block it was
     scored with, one token per step (`TRAINED`). A twin has seen no other length, so this wins
     over any task;
  2. a task: its own answer length (the eval task table, an lm-eval request) or the paper's length
     for it on this sampler (`TASK_LENGTHS`), with the paper's settings (`PAPER`); a length that
     is not a whole number of blocks is rounded up (the answer must fit);
  3. no task: the paper's GSM8K setting (`fallback="paper"`, the command line) or the official
     function's defaults (`fallback="official"`, the Python API: code moves over unchanged).
The user's settings go on top; a length the user gives moves the base's steps (one token per
step) and blocks with it (a preset's only: the official defaults stay as they are). Then the
context: when prompt + length exceeds it and the length is not the user's, the length is cut to
fit (whole blocks; steps follow) with a note; a length the user gave that does not fit is an error
naming the argument.

The per-sampler facts are data on the config class (`length_field`, `steps_field`, `block_field`,
`TASK_LENGTHS`, `PAPER`, `TRAINED`, `RENAMED`); nothing here names a sampler. Torch-free (the
command line imports it).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from sinklens.samplers.registry import SamplerConfig

DEFAULT_TASK = "gsm8k"  # the paper's setting when no task is named


def training_config(folder) -> dict | None:
    """train_config.json of a sinklens-trained model folder (shipped twin or a run's export/), else None."""
    if folder is None:
        return None
    folder = Path(folder)
    for path in (folder / "training" / "train_config.json", folder.parent / "config.json"):
        try:
            conf = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(conf, dict) and "gen_length" in conf and "kind" in conf:
            return conf
    return None


@dataclass(frozen=True)
class ModelFacts:
    """What the policy needs to know about a model."""

    context: int | None = None  # positions it takes (prompt + generation); None: no limit known
    train: dict | None = None  # its train_config.json when sinklens trained it

    @classmethod
    def of(cls, model) -> "ModelFacts":
        """The facts of a SinkModel (anything with `max_length` and `source["path"]`)."""
        folder = (getattr(model, "source", None) or {}).get("path")
        return cls(getattr(model, "max_length", None), training_config(folder))


@dataclass
class Settings:
    """The policy's answer: the sampler's arguments, where their base came from, and the notes."""

    sampler: type[SamplerConfig]
    values: dict  # field -> value; fields left out keep the sampler's defaults
    origin: str  # "the model's training config", "the paper's setting", ...
    notes: list[str] = field(default_factory=list)  # "note: ..." lines: a length cut to the context, blocks changed
    deprecated: list[str] = field(default_factory=list)  # "note: ..." lines: an old argument name was used

    def config(self) -> SamplerConfig:
        return self.sampler.from_kwargs(**self.values)


def settings(cls: type[SamplerConfig], model: ModelFacts = ModelFacts(), *, task: str | None = None,
             task_length: int | None = None, prompt_length: int | None = None, length: int | None = None,
             overrides: dict | None = None, fallback: str = "paper", flags: bool = True) -> Settings:
    """The settings of sampler `cls` on `model` for `task` (None: no task), after a prompt of
    `prompt_length` tokens (None: not known yet, no context check). `task_length`: the task's own
    answer length (None: the paper's for the task). `length`: the user's length (any sampler; the
    same as `overrides[cls.length_field]`); `overrides`: the user's settings by field name.
    `fallback`: "paper" or "official", the base without a training config or a task. `flags`: name
    arguments as command-line flags (`--gen-length`) in the notes and errors, else as keywords."""
    if fallback not in ("paper", "official"):
        raise ValueError(f"fallback must be 'paper' or 'official', got {fallback!r}")
    name = (lambda f: "--" + f.replace("_", "-")) if flags else (lambda f: f)
    overrides, deprecated = cls.upgrade(dict(overrides or {}), flags)
    notes = []
    lf = cls.length_field
    if length is not None:
        if lf and overrides.get(lf, length) != length:
            raise ValueError(f"two lengths given: {length} and {name(lf)} {overrides[lf]}")
        if lf:
            overrides[lf] = length
    if not lf:  # a sampler that generates nothing (encoders)
        return Settings(cls, overrides, "the sampler's defaults", notes, deprecated)
    values, origin = base_settings(cls, model.train, task, task_length, fallback, overrides.get(cls.block_field))
    user_length = overrides.get(lf)
    if user_length is not None and values:  # the preset's steps and blocks follow the user's length
        values, note = with_length(cls, values, user_length, overrides, name)
        notes += note
    values = {**values, **overrides}
    if model.context is not None and prompt_length is not None:
        values, note = fit_context(cls, values, model.context, prompt_length, user_length is not None, origin,
                                   overrides, name)
        notes += note
    return Settings(cls, values, origin, notes, deprecated)


def base_settings(cls, train: dict | None, task: str | None, task_length: int | None, fallback: str,
                  user_block: int | None) -> tuple[dict, str]:
    """(settings, origin) before the user's: a twin's training settings, else the task's, else the fallback."""
    if train is not None:
        n = int(train["gen_length"])
        return preset(cls, n, int(train.get("block_length") or n), cls.TRAINED), "the model's training config"
    if task_length is not None:
        origin = f"the {task} task's answer length" if task else "the requested length"
    elif task or fallback == "paper":
        task_length = cls.TASK_LENGTHS.get(task or DEFAULT_TASK)
        origin = f"the paper's setting for {task}" if task else "the paper's setting"
    if task_length is None:  # the official function's defaults (or a sampler without a paper setting)
        return {}, "the official defaults"
    block = None
    if cls.block_field:  # whole blocks, rounded up: the task's answer must fit
        block = user_block or min(cls.PAPER.get(cls.block_field, task_length), task_length)
        task_length = -(-task_length // block) * block
    return preset(cls, task_length, block, cls.PAPER), origin


def preset(cls, n: int, block: int | None, extra: dict) -> dict:
    """`extra` generating `n` tokens, one per step, in blocks of at most `block`."""
    out = {**extra, cls.length_field: n}
    if cls.steps_field:
        out[cls.steps_field] = n
    if cls.block_field:
        out[cls.block_field] = min(block or n, n)
    return out


def with_length(cls, values: dict, n: int, overrides: dict, name) -> tuple[dict, list[str]]:
    """`values` generating `n` tokens: steps stay one per token (or as many per block), the block
    stays where it divides `n`, else one block (with a note); fields in `overrides` stay."""
    d = {**cls.defaults(), **values}
    old = d[cls.length_field]
    out, notes = {**values, cls.length_field: n}, []
    block = n
    if cls.block_field:
        block = d[cls.block_field]
        if cls.block_field not in overrides and n % block:
            if block < old:  # the preset had several blocks; say why it has one now
                notes.append(f"note: {cls.block_field} {block} does not divide {cls.length_field} {n}: one block "
                             f"of {n}; set {name(cls.block_field)} to choose")
            block = out[cls.block_field] = n
    if cls.steps_field and cls.steps_field not in overrides:
        steps = d[cls.steps_field]
        if steps == old:
            out[cls.steps_field] = n
        elif cls.block_field:  # as many steps per block as before
            out[cls.steps_field] = max(1, steps // max(1, old // d[cls.block_field])) * (n // block)
    return out, notes


def fit_context(cls, values: dict, context: int, prompt_length: int, user_length: bool, origin: str,
                overrides: dict, name) -> tuple[dict, list[str]]:
    """`values` cut to fit prompt + length into the model's context (whole blocks), with a note."""
    lf = cls.length_field
    n = values.get(lf, cls.defaults().get(lf))
    room = context - prompt_length
    if n is None or n <= room:  # None: the checkpoint decides (DiffusionGemma's generation_config)
        return values, []
    if room < 1:
        raise ValueError(f"the prompt has {prompt_length} tokens and the model's context is {context}: "
                         "no room left to generate")
    if user_length:
        raise ValueError(f"{name(lf)} {n} does not fit: the prompt ({prompt_length} tokens) + {n} exceeds the "
                         f"model's context of {context}; {name(lf)} must be at most {room}")
    block = values.get(cls.block_field, cls.defaults().get(cls.block_field)) if cls.block_field else None
    fit = room // block * block if block and room >= block else room
    values, notes = with_length(cls, values, fit, overrides, name)
    return values, [f"note: {lf} {n} ({origin}) capped to {fit}: the prompt has {prompt_length} tokens and the "
                    f"model's context is {context}; set {name(lf)} to choose", *notes]
