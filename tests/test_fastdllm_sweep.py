"""Fast-dLLM's decoding over random argument combinations (tests/fixtures/fastdllm/sweep.json).

NVlabs/Fast-dLLM's own llada/generate.py and dream/model/generation_utils{,_block}.py wrote every
case on the official tiny LLaDA / Dream checkpoints (../shared/fixtures/reference), with the canvas
after every forward: sinklens must give the same tokens, step for step, with and without attention
capture, in float32 and (Dream) bfloat16. Where the official code fails or never ends, sinklens refuses the
input in one line.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import sinklens
from _kernels import param
from sinklens.samplers import CaptureOptions
from test_fastdllm import CACHE_OF, official_kwargs   # how an official call's arguments map to sinklens'

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "fastdllm"
SWEEP_META = json.loads((FIXTURE / "sweep.json").read_text())
SWEEP = SWEEP_META["cases"]
FACTOR = json.loads((FIXTURE / "factor.json").read_text())["cases"]  # newer Fast-dLLM's factor (make_factor.py)


def _early_stop(case) -> bool:
    """Fast-dLLM's generate() without a threshold and with more steps per block than the block has
    positions: it leaves a block once no [MASK] is left, LLaDA's generate() runs every step."""
    a = case["arguments"]
    return (case["function"].endswith(":generate") and a["threshold"] is None
            and a["steps"] // (a["gen_length"] // a["block_length"]) > a["block_length"])


EARLY = [c for c in SWEEP if _early_stop(c)]
RUNS = [c for c in SWEEP if "error" not in c and not _early_stop(c)] + FACTOR
ERRORS = [c for c in SWEEP if "error" in c]

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def models(fixtures_dir):
    loaded = {(name, "float32"): sinklens.load(fixtures_dir / name) for name in ("llada", "dream")}
    return loaded | {("dream", "bfloat16"): sinklens.load(fixtures_dir / "dream", dtype="bfloat16")}


def _run(models, case, **extra):
    m = models[case["family"], case["dtype"]]
    am = torch.tensor(case["attention_mask"]) if "attention_mask" in case else None
    torch.manual_seed(case["seed"])
    return m.generate(torch.tensor(case["input_ids"]), am, **official_kwargs(case), **extra)


def test_the_sweep_covers_what_the_named_cases_leave_out():
    """Prompts of one token, one-token blocks, one block, the random remasking with a threshold,
    sampled Dream batches with alg_temp, bfloat16, and official failures (padding among them): a change of
    the script that drops them fails here."""
    llada = [c for c in RUNS if c["family"] == "llada"]
    dream = [c for c in RUNS if c["family"] == "dream"]
    assert any(len(c["input_ids"][0]) == 1 for c in llada) and any(len(c["input_ids"][0]) == 1 for c in dream)
    assert {CACHE_OF[c["function"].split(":")[1]] for c in llada} == {"none", "prefix", "dual"}
    assert any(c["arguments"]["remasking"] == "random" and c["arguments"]["threshold"] for c in llada)
    assert any(c["arguments"]["block_length"] == 1 for c in llada)
    assert any(c["arguments"]["block_length"] == c["arguments"]["gen_length"] for c in llada)
    assert any(len(c["input_ids"]) == 2 and c["arguments"]["alg_temp"] and c["arguments"]["temperature"] for c in dream)
    assert any(c["arguments"].get("dual_cache") and c["arguments"]["alg"] == "confidence_threshold" for c in dream)
    assert {c["family"] for c in ERRORS} == {"llada", "dream"} and EARLY
    assert any("attention_mask" in c for c in ERRORS)
    assert {c["arguments"].get("dual_cache", None) for c in dream if c["dtype"] == "bfloat16"} == {None, False, True}


@pytest.mark.parametrize("traced", [False, True], ids=["plain", "traced"])
@pytest.mark.parametrize("case", [param(c, id=c["name"], dtype=c["dtype"], kernels=SWEEP_META.get("kernels"))
                                  for c in RUNS])
@pytest.mark.slow
@pytest.mark.sweep  # a slice by default (tests/conftest.py)
def test_token_exact_step_for_step(models, case, traced, tmp_path):
    extra = dict(trace=tmp_path / "run.arrow", capture=CaptureOptions(query_groups=True)) if traced else {}
    out = _run(models, case, **extra)
    if traced:  # the trace holds every step, each with the rows that step computed
        t = sinklens.open_trace(out.trace_path)
        assert t.num_steps == case["nfe"] and t.received(t.num_steps - 1).shape[-1] == len(case["history"][-1][0])
    assert out.num_steps == len(out.history) == case["nfe"]  # one step per official forward
    assert [h.tolist() for h in out.history] == case["history"]
    assert out.sequences.tolist() == case["expected_output_ids"]


@pytest.mark.parametrize("case", [param(c, id=c["name"], dtype=c["dtype"], kernels=SWEEP_META.get("kernels"))
                                  for c in EARLY])
def test_cache_none_without_threshold_is_llada_generate(models, case):
    """sinklens' cache='none' without a threshold is LLaDA's generate(), which runs every step of a
    block; Fast-dLLM's copy of it leaves a block at its first step without [MASK]. The two agree up
    to there, and sinklens runs the scheduled number of steps."""
    out = _run(models, case)
    a = case["arguments"]
    assert out.num_steps == a["steps"] > case["nfe"]
    P, bl = len(case["input_ids"][0]), a["block_length"]
    first = next(k for k, h in enumerate(case["history"]) if 300 not in h[0][P:P + bl])  # block 0 done
    assert [h.tolist() for h in out.history[:first + 1]] == case["history"][:first + 1]


@pytest.mark.parametrize("case", ERRORS, ids=[c["name"] for c in ERRORS])
def test_what_fails_officially_is_refused_in_one_line(models, case):
    with pytest.raises(ValueError) as e:
        _run(models, case)
    assert "\n" not in str(e.value) and len(str(e.value)) < 300
    if "attention_mask" in case:
        why = "no padding"
    elif len(case["input_ids"]) > 1:
        why = "one prompt at a time"
    else:
        why = {"IndexError": "at least 2 steps per block" if case["arguments"]["temperature"] < 20 else "still holds [MASK]",
               "AssertionError": "multiple of steps"}[case["error"].split(":")[0]]
    assert why in str(e.value)  # the line names what the official code could not take


def test_factor_commits_several_positions_per_step_as_the_official():
    """The factor cases are parallel decoding: some forwards commit several positions, some only one."""
    commits = []
    for c in FACTOR:
        canvases = [c["input_ids"][0] + [c["mask_id"]] * c["arguments"]["gen_length"]] + [h[0] for h in c["history"]]
        commits += [sum(a != b for a, b in zip(x, y)) for x, y in zip(canvases, canvases[1:])]
    assert max(commits) > 1 and min(commits) == 1


@pytest.mark.parametrize("extra", [dict(cache="prefix"), dict(threshold=0.5)], ids=["cache", "threshold"])
def test_factor_with_a_cache_or_threshold_is_refused(models, extra):
    with pytest.raises(ValueError, match=r"^factor=1\.0 takes neither a threshold nor a cache") as e:
        models["llada", "float32"].generate(torch.tensor([[5, 6, 7]]), gen_length=4, block_length=4, steps=4,
                                            factor=1.0, mask_id=300, **extra)
    assert "\n" not in str(e.value)
