"""Checkpoint variants: published checkpoints that load with an existing family adapter.

iLLaDA and LLaDA 1.5 are LLaDA checkpoints (same architecture and parameter names, run by the
LLaDA sampler); Dream-Coder and DiffuCoder are Dream checkpoints (Qwen2 shapes, Dream's
sampler). A variant changes no code path: it names the checkpoint (`SinkModel.variant`, the
trace metadata) and says which of its facts differ from the family's base checkpoints, so
that a wrong detection is visible instead of silent.

Detection, in order, from what the checkpoint itself ships (never from remote code):
  1. a tokenizer token only that variant has (DiffuCoder's `<|dlm_pad|>`);
  2. the variant's mask id (iLLaDA: 5, from config `mask_token_id` or the tokenizer's
     declared mask token; LLaDA's is 126336);
  3. a name: the hub id, the folder name, or config `_name_or_path` / `architectures` /
     `model_type` containing one of the variant's name keys. LLaDA 1.5 and Dream-Coder ship
     configs identical to their base family, so a name is all there is for them.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Variant:
    name: str  # "illada" | "llada-1.5" | "dream-coder" | "diffucoder"
    family: str  # the family adapter that loads it
    hub_ids: tuple[str, ...]  # known hub repos (docs / examples)
    name_keys: tuple[str, ...]  # normalised substrings of a hub id / folder / config name
    tokens: tuple[str, ...] = ()  # tokenizer tokens only this variant ships
    mask_id: int | None = None  # the variant's mask id where it differs from the family's
    pad_token: str | None = None  # the variant's padding token, when not EOS (DiffuCoder)


VARIANTS: tuple[Variant, ...] = (
    Variant("illada", "llada", ("GSAI-ML/iLLaDA-8B-Base", "GSAI-ML/iLLaDA-8B-Instruct"), ("illada",), mask_id=5),
    Variant("llada-1.5", "llada", ("GSAI-ML/LLaDA-1.5",), ("llada-1.5", "llada1.5", "llada-15")),
    Variant("diffucoder", "dream", ("apple/DiffuCoder-7B-Base", "apple/DiffuCoder-7B-Instruct",
                                    "apple/DiffuCoder-7B-cpGRPO"), ("diffucoder",),
            tokens=("<|dlm_pad|>",), pad_token="<|dlm_pad|>"),
    Variant("dream-coder", "dream", ("Dream-org/Dream-Coder-v0-Base-7B", "Dream-org/Dream-Coder-v0-Instruct-7B"),
            ("dream-coder", "dreamcoder")),
)


def _normalise(text: str) -> str:
    return re.sub(r"[\s_]+", "-", text.lower())


def name_hints(config: dict, name_or_path: str | Path | None) -> str:
    """Everything that may carry a checkpoint's name, lower-cased, `_`/space -> `-`.

    A hub-cache snapshot folder is `models--owner--name/snapshots/<commit>`: the repo part counts.
    """
    parts = [str(config.get("_name_or_path") or ""), str(config.get("model_type") or "")]
    parts += [str(a) for a in config.get("architectures") or []]
    if name_or_path is not None:
        path = Path(str(name_or_path))
        parts += [str(name_or_path)] + [p for p in path.parts[-3:]]
    return " ".join(_normalise(p) for p in parts)


def detect_variant(family: str, config: dict, tokenizer: Any, name_or_path: str | Path | None,
                   mask_id: int | None) -> Variant | None:
    """The variant of a checkpoint of `family`, or None (the family's base checkpoints)."""
    candidates = [v for v in VARIANTS if v.family == family]
    vocab = tokenizer.get_vocab() if tokenizer is not None else {}
    for v in candidates:  # 1. tokens only this variant ships
        if v.tokens and all(t in vocab for t in v.tokens):
            return v
    for v in candidates:  # 2. a mask id of its own
        if v.mask_id is not None and mask_id == v.mask_id:
            return v
    hints = name_hints(config, name_or_path)
    for v in candidates:  # 3. its name
        if any(key in hints for key in v.name_keys):
            return v
    return None
