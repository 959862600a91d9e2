"""A GGUF checkpoint loads through its converted copy exactly as through the file (models/gguf_copy.py).

The first load of a GGUF file converts it and keeps the copy in the cache folder; a later load reads
the copy. What a user relies on: the second load is the same model, tensor for tensor, with the same
config (what traces record), tokenizer and chat template, and generates the same tokens; a damaged
copy is made again rather than read.
"""
from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest
import torch

import sinklens
from sinklens.models import gguf_copy


@pytest.mark.parametrize("damage", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_the_converted_copy_is_the_conversion(tmp_path, monkeypatch, damage):
    monkeypatch.setenv("SINKLENS_CACHE", str(tmp_path / "cache"))
    stale, fresh = tmp_path / "cache" / "gguf" / ".writing-killed", tmp_path / "cache" / "gguf" / ".writing-now"
    for left in (stale, fresh):   # what writes killed midway left, an hour ago and now
        left.mkdir(parents=True)
        (left / "model.safetensors").write_bytes(b"half")
    os.utime(stale, (time.time() - 7200, time.time() - 7200))
    first = sinklens.load("smollm2-135m-instruct")            # converts and writes the copy
    assert not stale.exists() and fresh.exists()              # an old leftover is removed, a running write not
    shutil.rmtree(fresh)
    (copy,) = (tmp_path / "cache" / "gguf").iterdir()
    assert copy.name == gguf_copy.cache_key(Path(first.source["path"]) / first.source["gguf_file"], torch.float32)
    if damage:
        (copy / "model.safetensors").write_bytes(b"not safetensors")
    calls = []
    real = gguf_copy._write
    monkeypatch.setattr(gguf_copy, "_write", lambda *a: calls.append(1) or real(*a))
    second = sinklens.load("smollm2-135m-instruct")
    assert calls == ([1] if damage else [])                    # read the copy; a damaged one is made again
    a, b = first.model.state_dict(), second.model.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert second.model.lm_head.weight.data_ptr() == second.model.model.embed_tokens.weight.data_ptr()  # tied
    assert type(second.model) is type(first.model) and second.model.config._attn_implementation == "sinklens"
    assert second.config_dict == first.config_dict and second.source == first.source
    text = "Max has 29 cards. He finds 22 more. How many cards now?"
    assert second.apply_chat_template(text) == first.apply_chat_template(text)
    assert second.tokenizer.decode(second.apply_chat_template(text)) == first.tokenizer.decode(first.apply_chat_template(text))
    ids = torch.tensor([first.apply_chat_template(text)])
    assert torch.equal(second.generate(ids, max_new_tokens=6).sequences, first.generate(ids, max_new_tokens=6).sequences)


def test_a_files_hash_is_read_once_and_read_again_once_the_file_changes(tmp_path, monkeypatch):
    """file_sha256 (the Gemma3 check and the GGUF copy's key) reads a file once per process while it stays
    as it was; a rewritten file (another size, a new inode) is hashed anew."""
    import hashlib

    from sinklens import cache

    f = tmp_path / "w.gguf"
    f.write_bytes(b"a" * 1000)
    assert cache.file_sha256(f) == hashlib.sha256(b"a" * 1000).hexdigest()
    opened = []
    real_open = open
    monkeypatch.setattr("builtins.open", lambda *a, **k: opened.append(a[0]) or real_open(*a, **k))
    assert cache.file_sha256(f) == hashlib.sha256(b"a" * 1000).hexdigest() and opened == []
    monkeypatch.undo()
    (tmp_path / "new").write_bytes(b"b" * 999)
    (tmp_path / "new").replace(f)
    assert cache.file_sha256(f) == hashlib.sha256(b"b" * 999).hexdigest()
