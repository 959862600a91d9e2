"""Table 1 (`sinklens eval --task arith`) on the tiny checkpoints of the 2026 families: SDAR
(block-causal with a KV cache), LLaDA2.0 (block-causal MoE), LLaDA2.1 (the same checkpoint through
its editing sampler, `--sampler llada21`) and LLaDA-MoE, each with a tokenizer (tests/_tokenizers.py).

Masking K = 1, 5, 10 with the random-key control beside each: the summary has every row, every
masked and control sample its outcome readouts against the unmasked output, and re-running with
a larger --limit resumes (the samples done are kept byte for byte, only the new one is added).
Random weights answer ~nothing right: what is checked is the machinery, not the accuracy."""
from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import torch

from _tokenizers import with_tokenizer
from sinklens.cli import main
from sinklens.eval.outcomes import READOUTS
from sinklens.eval.records import collect
from sinklens.eval.summary import PAPER_K_NAMES

FIXTURES = Path(__file__).resolve().parent / "fixtures"
# name: (fixture, end token id, mask token, the sampler that runs, sampler flags)
FAMILIES = {
    "sdar": ("sdar", 299, "<|MASK|>", "sdar", ["--gen-length", "8", "--block-length", "4", "--denoising-steps", "2",
                                       "--top-k", "1"]),
    "llada2": ("llada2", 157, "<|mask|>", "llada2", ["--gen-length", "8", "--block-length", "4", "--steps", "4",
                                          "--threshold", "0.5"]),
    "llada21": ("llada2", 157, "<|mask|>", "llada21", ["--sampler", "llada21", "--gen-length", "8", "--block-length", "4",
                                           "--threshold", "0.5", "--editing-threshold", "0.3"]),
    "lladamoe": ("lladamoe", 299, "<|mask|>", "llada", ["--gen-length", "8", "--block-length", "4", "--steps", "4"]),
}
KS = (1, 5, 10)

torch.set_num_threads(1)


def records(run_dir: Path) -> list[dict]:
    return sorted(collect(str(run_dir)), key=lambda r: r["index"])


@pytest.mark.slow
@pytest.mark.parametrize("name", list(FAMILIES))
def test_table1_with_random_control_and_resume(tmp_path, name):
    fixture, eos, mask_token, sampler, flags = FAMILIES[name]
    model = str(with_tokenizer(FIXTURES / fixture, tmp_path / name, eos_id=eos, mask_token=mask_token))
    out = tmp_path / "eval"
    argv = ["eval", "--model", model, "--task", "arith", "--mask-topk", "0," + ",".join(map(str, KS)),
            "--mask-control", "random", *flags, "--out", str(out), "-q"]
    assert main([*argv, "--limit", "2"]) == 0

    runs = out / name / "arith"
    names = ["k0", *(f"k{k}{c}" for k in KS for c in ("", "-random"))]
    assert sorted(p.name for p in runs.iterdir() if p.is_dir()) == sorted(names)
    first = {n: records(runs / n) for n in names}
    assert all(len(r) == 2 for r in first.values()), {n: len(r) for n, r in first.items()}
    meta = json.loads((runs / "k1" / "config.json").read_text())
    assert meta["sampler"] == sampler
    for n in names[1:]:
        for r in first[n]:
            o = r["outcome"]                                    # every masked / control sample against k0
            assert set(READOUTS) <= set(o) and all(o[x] is not None for x in READOUTS), (n, o)
            assert 0.0 <= o["edit_distance"] <= 1.0 and o["similarity"] == pytest.approx(1 - o["edit_distance"])
            assert o["kl"] >= 0.0
            assert r["masked"] is not None                       # the policy blocked keys and said which
    blocked_somewhere = any(r["output_ids"] != u["output_ids"] or r["outcome"]["kl"] > 1e-6
                            for n in names[1:] for r, u in zip(first[n], first["k0"]))
    assert blocked_somewhere                                    # masking reached the model on this family

    rows = {r["row"]: r for r in csv.DictReader((out / "summary.csv").open())}
    want = [PAPER_K_NAMES[0], *(PAPER_K_NAMES[k] for k in KS),
            *(f"K={k} random keys (control)" for k in KS)]
    missing = [w for w in want if not any(row.startswith(w) for row in rows)]
    assert not missing, (missing, list(rows))
    for label, row in rows.items():
        if label.startswith(PAPER_K_NAMES[0]):
            continue
        assert int(row["n_outcome"]) == 2 and row["edit_distance"] not in ("", "nan"), (label, row)

    # resume: a larger --limit keeps the samples done and adds one
    assert main([*argv, "--limit", "3"]) == 0
    again = {n: records(runs / n) for n in names}
    for n in names:
        assert len(again[n]) == 3 and again[n][:2] == first[n], n
    assert all("outcome" in r for n in names[1:] for r in again[n])


def test_a_sampler_the_family_does_not_run_is_one_line(tmp_path, capsys):
    model = str(with_tokenizer(FIXTURES / "sdar", tmp_path / "sdar", eos_id=299, mask_token="<|MASK|>"))
    common = ["eval", "--model", model, "--task", "arith", "--limit", "1", "--out", str(tmp_path / "out")]
    assert main([*common, "--sampler", "llada21"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--sampler 'llada21' does not run" in err[0] and "sdar" in err[0], err
    assert main([*common, "--sampler", "nope"]) == 2
    assert "--sampler must be one of" in capsys.readouterr().err
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").rglob("*.jsonl"))
