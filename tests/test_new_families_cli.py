"""Smoke test: `sinklens trace`, `sinklens report` and `sinklens eval --task arith` with the
random-key masking control run on the tiny SDAR and LLaDA-MoE checkpoints (tests/fixtures), each
given a small tokenizer (tests/_tokenizers.py) so text goes in and out."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from _tokenizers import with_tokenizer
from sinklens.cli import main

FIXTURES = Path(__file__).resolve().parent / "fixtures"
MASK_TOKEN = {"sdar": "<|MASK|>", "lladamoe": "<|mask|>"}

torch.set_num_threads(1)


@pytest.mark.parametrize("name,flags", [
    ("sdar", ["--gen-length", "8", "--block-length", "4", "--denoising-steps", "2", "--top-k", "1"]),
    ("lladamoe", ["--gen-length", "8", "--block-length", "4", "--steps", "4"]),
])
@pytest.mark.slow
def test_trace_report_and_masked_eval(tmp_path, name, flags):
    model = str(with_tokenizer(FIXTURES / name, tmp_path / name, eos_id=299, mask_token=MASK_TOKEN[name]))
    trace = tmp_path / "run.arrow"
    assert main(["trace", "--model", model, "--prompt", "What is 3 plus 4?", "--raw", *flags, "--out", str(trace), "-q"]) == 0
    assert main(["report", str(trace), "--out", str(tmp_path / "report"), "-q"]) == 0
    assert (tmp_path / "report" / "summary.json").is_file()
    out = tmp_path / "eval"
    assert main(["eval", "--model", model, "--task", "arith", "--limit", "2", "--mask-topk", "0,1",
                 "--mask-control", "random", *flags, "--out", str(out), "-q"]) == 0
    rows = [json.loads(line) for p in out.rglob("*.jsonl") for line in p.read_text().splitlines() if line.strip()]
    assert len(rows) >= 4                                                # 2 problems x K in {0, 1}


def test_a_shared_flag_takes_each_samplers_range(capsys):
    """--top-k is >= 0 for SDAR (and for an ARM, where 0 = off as in transformers): 0 reaches SDAR; -1,
    which no sampler takes, is one error line before any model loads; --temperature 0, which LLaDA
    takes, is the ARM sampler's own one line when it samples."""
    sdar = str(FIXTURES / "sdar")
    common = ["--input-ids", "1,2,3", "--gen-length", "4", "--block-length", "4", "--denoising-steps", "2", "-q"]
    assert main(["generate", "--model", sdar, "--top-k", "0", *common]) == 0
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        main(["generate", "--model", sdar, "--top-k", "-1", *common])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1 and "argument --top-k: must be an integer >= 0, got -1" in err[0]
    arm = ["generate", "--model", "tiny-arm", "--input-ids", "1,2", "-q"]
    assert main([*arm, "--temperature", "0", "--do-sample"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "needs temperature > 0" in err[0], err
