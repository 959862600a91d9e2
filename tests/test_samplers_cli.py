"""`sinklens generate` / `sinklens trace` on the official fixtures (expected ids from cases.json)."""
import json
import re

import pytest
import torch

import sinklens
from sinklens.cli import main

torch.set_num_threads(1)


def _case(fixtures_dir, family, name):
    return next(c for c in json.loads((fixtures_dir / family / "cases.json").read_text())["cases"] if c["name"] == name)


def official_flags(case) -> list[str]:
    """The official call's arguments as flags (None = official "off": top-p 1, alg_temp 0 mean the same)."""
    off = {"top_p": 1, "alg_temp": 0}
    out = []
    for k, v in case["arguments"].items():
        if k in ("prompt", "inputs", "attention_mask", "output_history", "return_dict_in_generate"):
            continue
        if v is None and k not in off:
            continue
        out += ["--" + k.replace("_", "-"), str(off[k] if v is None else v)]
    return out


def test_generate_json_equals_official(fixtures_dir, capsys):
    case = _case(fixtures_dir, "llada", "generate_semi_ar")
    ids = case["input_ids"][1]
    assert main(["generate", "--model", str(fixtures_dir / "llada"), "--input-ids", ",".join(map(str, ids)),
                 *official_flags(case), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["sequence"] == case["expected_output_ids"][1] and out["prompt_ids"] == ids


def test_trace_writes_a_readable_trace(fixtures_dir, tmp_path, capsys):
    case = _case(fixtures_dir, "dream", "generate_entropy")
    ids = case["input_ids"][0]
    path = tmp_path / "run.arrow"
    assert main(["trace", "--model", str(fixtures_dir / "dream"), "--input-ids", ",".join(map(str, ids)),
                 *official_flags(case), "--map-slices", "1:2", "--out", str(path)]) == 0
    assert capsys.readouterr().out.split() == [str(i) for i in case["expected_output_ids"][0][len(ids):]]
    t = sinklens.open_trace(path)
    assert t.num_steps == 16 and not t.truncated and t.meta["sampler"]["args"]["alg"] == "entropy"
    assert t.map(0, 1, 2).shape == (24, 24)


@pytest.mark.parametrize("argv,match", [
    (["--input-ids", "1,x"], "must be comma-separated integers"),
    (["--input-ids", "1,2", "--gen-length", "16"], r"unknown argument\(s\) \['gen_length'\]"),
    (["--prompt", "hello"], "has no tokenizer: pass --input-ids"),
    (["--input-ids", "1,2", "--alg", "nope"], r"argument --alg: must be one of \['origin'"),
    (["--input-ids", "1,2", "--steps", "0"], r"argument --steps: must be a positive integer, got 0"),
    # a flag several samplers share takes what any of them does (LLaDA2's top_p includes 0) ...
    (["--input-ids", "1,2", "--top-p", "nan"], r"argument --top-p: must be in \[0, 1\], got nan"),
    # ... and the model's own sampler checks its range (Dream: (0, 1])
    (["--input-ids", "1,2", "--top-p", "0"], r"top_p must be in \(0, 1\], got 0"),
])
def test_bad_cli_input_is_a_clear_error(fixtures_dir, argv, match, capsys):
    try:
        code = main(["generate", "--model", str(fixtures_dir / "dream"), *argv])
    except SystemExit as e:  # argparse
        code = e.code
    err = capsys.readouterr().err
    assert code == 2 and re.search(match, err) and len(err.strip().splitlines()) == 1, err
