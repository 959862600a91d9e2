"""GGUF checkpoints: dequantised by transformers + gguf once, then read back as safetensors.

Reading a GGUF file is slow in Python: for SmolLM2-135M (98 MB) transformers' reader takes ~25 s
for the weights and ~8 s for the tokenizer on a 2-core VM, of which dequantising is ~2 s; the rest
is parsing. So the first load converts, then writes what it made (the weights as safetensors, the
config, the tokenizer) into the cache folder (`sinklens.cache`), under a key made of the file's
sha256, the dtype and the versions of transformers and gguf that converted it; a later load reads
that copy (a few seconds). The copy holds the very tensors the conversion made, bit for bit
(tests/test_gguf_cache.py). Best effort: a copy that cannot be written is skipped, and one that
cannot be read is made again.
"""
from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch

from sinklens.attention import ATTENTION_NAME
from sinklens.cache import cache_dir, file_sha256

CONFIG_DICT = "sinklens-config.json"  # the config dict the conversion gave (what a trace records)


def cache_key(path: Path, dtype: torch.dtype) -> str:
    """The converted copy's folder name: the file's content, the dtype, the converting versions."""
    versions = "-".join(importlib.metadata.version(p) for p in ("transformers", "gguf"))
    return f"{file_sha256(path)[:24]}-{str(dtype).removeprefix('torch.')}-{versions}"


def load(folder: Path, gguf_file: str, dtype: torch.dtype):
    """(model, config dict, tokenizer) of `folder / gguf_file`, through the converted copy when there is one."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    copy = cache_dir() / "gguf" / cache_key(folder / gguf_file, dtype)
    if (copy / CONFIG_DICT).is_file():
        try:
            model = AutoModelForCausalLM.from_pretrained(str(copy), dtype=dtype, attn_implementation=ATTENTION_NAME,
                                                         trust_remote_code=False)
            tokenizer = AutoTokenizer.from_pretrained(str(copy))
            return model, json.loads((copy / CONFIG_DICT).read_text()), tokenizer
        except Exception:   # a copy another version left, or a damaged one: made again below
            shutil.rmtree(copy, ignore_errors=True)
    model = AutoModelForCausalLM.from_pretrained(str(folder), gguf_file=gguf_file, dtype=dtype,
                                                 attn_implementation=ATTENTION_NAME, trust_remote_code=False)
    tokenizer = AutoTokenizer.from_pretrained(str(folder), gguf_file=gguf_file)
    config_dict = json.loads(model.config.to_json_string(use_diff=False))  # as a config.json reads back
    _write(copy, model, config_dict, tokenizer)
    return model, config_dict, tokenizer


def _write(copy: Path, model, config_dict: dict, tokenizer) -> None:
    """Write the converted copy into a temporary folder beside it, then rename it into place (atomic:
    several processes converting at once leave one whole copy, never a half-written one)."""
    from safetensors.torch import save_model

    try:
        copy.parent.mkdir(parents=True, exist_ok=True)
        for left in copy.parent.glob(".writing-*"):   # a write killed midway (an hour old: nobody's now)
            if time.time() - left.stat().st_mtime > 3600:
                shutil.rmtree(left, ignore_errors=True)
        tmp = Path(tempfile.mkdtemp(dir=copy.parent, prefix=".writing-"))
    except OSError:
        return
    try:
        save_model(model, str(tmp / "model.safetensors"))   # tied weights once, as from_pretrained re-ties them
        config = {k: v for k, v in config_dict.items() if k != "quantization_config"}
        (tmp / "config.json").write_text(json.dumps(config, indent=2))
        tokenizer.save_pretrained(str(tmp))
        (tmp / CONFIG_DICT).write_text(json.dumps(config_dict))
        size = sum(f.stat().st_size for f in tmp.iterdir())
        os.rename(tmp, copy)
        print(f"sinklens: kept the converted GGUF in {copy} ({size / 1e9:.1f} GB; later loads read it)", file=sys.stderr)
    except OSError:   # a full disk, a read-only cache, or another process was first: keep what is there
        shutil.rmtree(tmp, ignore_errors=True)
