"""A model bigger than its memory cap: loaded with accelerate's big-model inference
(device_map="auto", max_memory, disk offload) it generates the same tokens and records the same
received attention as the model loaded whole (CPU only here: the layers that do not fit the cap
go to disk and are streamed in per forward)."""
from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from sinklens.models.loader import load
from sinklens.samplers.capture import CaptureOptions
from sinklens.trace.reader import open_trace

SETTINGS = dict(steps=4, gen_length=8, block_length=8)


@pytest.mark.slow
@pytest.mark.parametrize("share, placed", [(0.5, {"cpu", "disk"}), (0.0, {"disk"})])   # split; all on disk
def test_offloaded_trace_equals_the_whole_model(share, placed, tiny_dlm, tmp_path):
    weights = os.path.getsize(os.path.join(tiny_dlm, "model.safetensors"))
    whole = load(tiny_dlm)
    sharded = load(tiny_dlm, device_map="auto", max_memory={"cpu": int(weights * share)},
                   offload_folder=tmp_path / "offload")
    assert set(sharded.model.hf_device_map.values()) == placed, sharded.model.hf_device_map
    ids = torch.tensor([whole.tokenizer.encode("Natalia sold clips to 48 of her friends")])
    capture = CaptureOptions(received_dtype="float32")
    runs = []
    for m, name in ((whole, "whole"), (sharded, "sharded")):
        torch.manual_seed(0)
        out = m.generate(ids, trace=tmp_path / f"{name}.arrow", capture=capture, **SETTINGS)
        runs.append((out, open_trace(tmp_path / f"{name}.arrow")))
    (oa, ta), (ob, tb) = runs
    assert torch.equal(oa.sequences, ob.sequences)
    assert ta.steps == tb.steps and len(ta.steps) == SETTINGS["steps"]
    for s in ta.steps:
        assert np.array_equal(ta.tokens(s), tb.tokens(s))
        np.testing.assert_allclose(tb.received(s), ta.received(s), atol=1e-6, rtol=0)
        np.testing.assert_allclose(tb.received_groups(s), ta.received_groups(s), atol=1e-6, rtol=0)


@pytest.mark.parametrize("kwargs, expected", [
    (dict(max_memory={"cpu": "1GB"}), "max_memory and offload_folder go with device_map"),
    (dict(device="cpu", device_map="auto"), "give device or device_map, not both"),
    (dict(device_map="everywhere"), "device_map must be 'auto'"),
])
def test_bad_sharding_arguments_are_one_line(kwargs, expected):
    with pytest.raises(ValueError, match=expected):
        load("tiny-dlm", **kwargs)
