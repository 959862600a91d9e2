"""Loading checkpoints into native transformers classes: one adapter module per diffusion family
(LLaDA / MMaDA, Dream, LLaDA2, LLaDA-MoE, SDAR, DiffusionGemma; their published variants in
`variants.py`), and any causal LM or masked-LM encoder transformers ships (`arm.py`, `encoder.py`).

The names below are imported from their module on first use: the command line reads
`sinklens.models.options` (the load flags) for --help, which must not import torch or transformers.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sinklens.models.families import FAMILIES, Family, detect_family, get_family, register_family
    from sinklens.models.loader import ALIASES, load, register_alias
    from sinklens.models.options import LoadOptions
    from sinklens.models.wrapper import SinkModel

_HOME = {"FAMILIES": "families", "Family": "families", "detect_family": "families", "get_family": "families",
         "register_family": "families", "ALIASES": "loader", "load": "loader", "register_alias": "loader",
         "LoadOptions": "options", "SinkModel": "wrapper"}


def __getattr__(name: str):
    if name in _HOME:
        return getattr(importlib.import_module(f"{__name__}.{_HOME[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = list(_HOME)
