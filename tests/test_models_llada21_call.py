"""LLaDA2.1's official call on an llada2_moe checkpoint (whose config does not tell 2.1 from 2.0):
`generate(ids, gen_length=..., threshold=..., editing_threshold=..., max_post_steps=..., num_to_transfer=...)`
runs LLaDA2.1's editing sampler, picked from the argument names only it takes; a refusal names it."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import sinklens

FIXTURES = Path(__file__).parent / "fixtures" / "llada2"
CASES = json.loads((FIXTURES / "cases.json").read_text())["cases"]
EDITING = next(c for c in CASES if c["kind"] == "generate" and c["model"] == "llada21")


@pytest.fixture(scope="module")
def model():
    return sinklens.load(FIXTURES)


@pytest.mark.slow
def test_the_official_call_runs_the_editing_sampler(model):
    """The official case's arguments as the model card writes them, without sampler=: the official
    tokens (the 2.0 sampler refused editing_threshold before)."""
    a = EDITING["arguments"]
    ids = torch.tensor(EDITING["input_ids"])
    out = model.generate(ids, **a)
    assert out.sequences[0, ids.shape[1]:].tolist() == EDITING["expected_output_ids"][0]
    assert model.family.pick_sampler(None, a) == "llada21"
    assert model.family.pick_sampler(None, {"threshold": 0.9, "gen_length": 8}) == "llada2"   # 2.0's call stays 2.0's
    assert model.family.pick_sampler(None, {}) == "llada2"


def test_a_refusal_names_the_editing_sampler(model):
    ids = torch.tensor(EDITING["input_ids"])
    with pytest.raises(ValueError, match=r"sampler='llada21'"):
        model.generate(ids, sampler="llada2", gen_length=8, block_length=4, editing_threshold=0.5)
    # a 2.1 argument beside one no sampler of the family takes: the refusal is the 2.1 sampler's
    with pytest.raises(TypeError, match=r"the llada21 sampler got unknown argument\(s\) \['alg'\]"):
        model.generate(ids, gen_length=8, block_length=4, editing_threshold=0.5, alg="entropy")


@pytest.mark.slow
def test_the_command_line_picks_it_from_the_flags_too(capsys):
    from sinklens.cli import main

    a = EDITING["arguments"]
    flags = [x for k, v in a.items() for x in ("--" + k.replace("_", "-"), str(v))]
    ids = ",".join(map(str, EDITING["input_ids"][0]))
    assert main(["generate", "--model", str(FIXTURES), "--input-ids", ids, *flags, "--json", "-q"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["sampler"]["name"] == "llada21" and out["generated_ids"] == EDITING["expected_output_ids"][0]
