"""One model to trace in an experiment: what to load, its label, its sampler and load settings."""
from __future__ import annotations

import re
from dataclasses import dataclass, field


def slug(label: str) -> str:
    """A model label as a file-name part: 'tiny-dual (ar)' -> 'tiny-dual-ar'."""
    return re.sub(r"[^\w.-]+", "-", label).strip("-")


@dataclass
class DemoModel:
    name: str  # alias or path given to sinklens.load
    label: str
    sampler_kwargs: dict = field(default_factory=dict)
    load_kwargs: dict = field(default_factory=dict)  # e.g. dtype for sinklens.load
