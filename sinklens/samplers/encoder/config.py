"""Encoder "sampler" settings: none (one forward pass)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from sinklens.samplers.registry import SamplerConfig, register


@register("encoder")
@dataclass
class EncoderConfig(SamplerConfig):
    """BERT / ModernBERT: one forward pass recorded as a one-step trace; nothing to set."""

    length_field: ClassVar[str] = ""  # generates nothing
    generates: ClassVar[bool] = False

    @property
    def length(self) -> int:
        return 0
