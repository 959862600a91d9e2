"""Sampler settings that work on the model at hand: what `sinklens generate` / `trace` run when
no length is given.

Source, first that applies: the model's own training config (a sinklens-trained twin: the
settings it was scored with), else the paper's GSM8K setting (SPEC §6; LLaDA: 256 tokens and
steps, blocks of 32, greedy; Dream: 256 tokens and steps, entropy order, T 0.1, top-p 0.9; ARM:
256 tokens, greedy). The user's arguments go on top. When prompt + length does not fit the
model's context and the user did not set the length, the length is cut to fit (whole LLaDA
blocks; steps follow) and a note says so.
"""
from __future__ import annotations

import json
from pathlib import Path

from sinklens.samplers.configs import SamplerConfig, get_config


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


def default_config(model, prompt_length: int, sampler: str | None = None, **overrides) -> tuple[SamplerConfig, list[str]]:
    """(config, notes) for generating after a `prompt_length`-token prompt on `model` (a SinkModel)."""
    cls = get_config(sampler or model.family.sampler)
    train = training_config((getattr(model, "source", None) or {}).get("path"))
    if train is not None:
        settings, origin = cls.trained_settings(train), "the model's training config"
    else:
        settings, origin = cls.paper_settings(), "the paper's setting"
    notes = []
    field = cls.length_field
    if not field:  # a sampler that generates nothing (encoders)
        return cls.from_kwargs(**{**settings, **overrides}), notes
    if field in overrides:  # the user's length; steps / blocks of the preset follow it
        settings = cls.with_length(settings, overrides[field])
    settings = {**settings, **overrides}
    limit = getattr(model, "max_length", None)
    length = cls.from_kwargs(**settings).length
    if limit is not None and field not in overrides and prompt_length + length > limit and limit - prompt_length >= 1:
        settings = cls.with_length(settings, cls.fit_length(settings, limit - prompt_length))
        notes.append(f"note: {field} {length} ({origin}) capped to {settings[field]}: the prompt has "
                     f"{prompt_length} tokens and the model's context is {limit}; set --{field.replace('_', '-')} "
                     "to choose")
    return cls.from_kwargs(**settings), notes
