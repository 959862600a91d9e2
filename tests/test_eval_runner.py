"""The eval runner: resume after kill -9, 2-process data parallel = 1 process, bad inputs.

Model: `tiny_dlm` (conftest.py), the official tiny LLaDA checkpoint of the fixtures with a small
tokenizer, so the whole DLM path (LLaDA sampler, masking hook, log-likelihood) runs in seconds. The reference for resume and data-parallel
runs is an uninterrupted single-process run of the same command.
"""
import csv
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from sinklens.cli import main
from sinklens.eval import records
from sinklens.eval.runner import EvalConfig, run_eval

torch.set_num_threads(1)   # 2 shared cores: one thread is several times faster than two under load
REPO = Path(__file__).resolve().parents[1]
GSM8K = str(REPO / ".." / "shared" / "data" / "gsm8k" / "test.jsonl")
N = 4
ARGS = ["--task", "gsm8k", "--data", GSM8K, "--limit", str(N), "--mask-topk", "1", "--shots", "0",
        "--gen-length", "8", "--block-length", "4", "--no-progress"]


def cli(*args, env_extra=None):
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    env.update(env_extra or {})
    return [sys.executable, "-m", "sinklens.cli", *args], env


def reference_cfg(model, out):
    return dict(model=model, task="gsm8k", out=out, mask_topk=(1,), limit=N, data=GSM8K, shots=0,
                gen_length=8, sampler_args={"block_length": 4}, progress=False)


def comparable(recs):
    return [{k: v for k, v in r.items() if k not in ("timing",)} for r in recs]


@pytest.fixture(scope="module")
def reference(tiny_dlm, tmp_path_factory):
    """One uninterrupted single-process run (in this process, one thread like the subprocesses)."""
    out = str(tmp_path_factory.mktemp("ref"))
    cfg = EvalConfig(**reference_cfg(tiny_dlm, out))
    (run_dir,) = run_eval(cfg)
    recs = records.collect(run_dir)
    assert [r["index"] for r in recs] == list(range(N))
    assert all(r["masked"]["steps_masked"] == 7 for r in recs)          # 8 steps, step 0 unmasked
    assert os.path.isfile(os.path.join(out, "summary.md")) and os.path.isfile(os.path.join(out, "summary.csv"))
    return run_dir, recs


@pytest.mark.slow
def test_kill9_then_resume(tiny_dlm, reference, tmp_path):
    run_dir_ref, ref = reference
    cmd, env = cli("eval", "--model", tiny_dlm, "--out", str(tmp_path), *ARGS)
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    shard = tmp_path / os.path.relpath(run_dir_ref, Path(run_dir_ref).parents[2]) / "samples.rank0.jsonl"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and len(records.read_records(str(shard))[0]) < 1:
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    done_before = len(records.read_records(str(shard))[0])
    assert 1 <= done_before < N, "the kill did not land mid-run"
    with open(shard, "ab") as f:                                        # as if killed mid-write
        f.write(b'{"id": "line' + str(done_before + 1).encode() + b'", "index": ')
    assert main(cmd[3:]) == 0                                           # the same command again, resumes
    lines = [json.loads(line) for line in open(shard)]                  # every line complete now
    assert sorted(r["id"] for r in lines) == sorted(r["id"] for r in ref)   # none lost, none twice
    assert comparable(records.collect(str(shard.parent))) == comparable(ref)


@pytest.mark.slow
def test_two_processes_equal_one(tiny_dlm, reference, tmp_path):
    run_dir_ref, ref = reference
    cmd, env = cli("eval", "--model", tiny_dlm, "--out", str(tmp_path), *ARGS)
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
              "-m", "sinklens.cli", *cmd[3:]]
    subprocess.run(launch, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    run_dir = tmp_path / os.path.relpath(run_dir_ref, Path(run_dir_ref).parents[2])
    assert sorted(p.name for p in run_dir.glob("samples*.jsonl")) == [
        "samples.jsonl", "samples.rank0.jsonl", "samples.rank1.jsonl"]
    merged = [json.loads(line) for line in open(run_dir / "samples.jsonl")]
    assert comparable(merged) == comparable(ref)
    # each rank did its own half: rank r has the samples i with i % 2 == r
    for r in (0, 1):
        assert [x["index"] for x in records.read_records(str(run_dir / f"samples.rank{r}.jsonl"))[0]] == \
            list(range(r, N, 2))


def test_summary_side_by_side(reference, tmp_path):
    from sinklens.eval.summary import write_summary
    run_dir, _ = reference
    other = tmp_path / "other"                     # a second "model": the same run under another name
    shutil.copytree(run_dir, other / "m2" / "gsm8k" / "k1")
    meta = json.loads((other / "m2" / "gsm8k" / "k1" / "config.json").read_text())
    (other / "m2" / "gsm8k" / "k1" / "config.json").write_text(json.dumps(dict(meta, model="model-two")))
    md, csv_text = write_summary([str(Path(run_dir).parents[2]), str(other)], str(tmp_path))
    header = md.splitlines()[0]
    assert header.count("|") == 5 and "model-two" in header              # task, masking, 2 models
    row = next(line for line in md.splitlines() if line.startswith("| gsm8k | K=1 (ε0) |"))
    assert row.count("(n=4)") == 2
    assert csv_text.splitlines()[0].startswith("model,task,mask_topk,n,n_expected,accuracy,stderr")


def test_bad_inputs(tiny_dlm, reference, tmp_path, capsys):
    run_dir, _ = reference
    with pytest.raises(ValueError, match="unknown task 'mmlu'"):
        EvalConfig(model=tiny_dlm, task="mmlu", out=str(tmp_path))
    with pytest.raises(FileNotFoundError, match="--data"):
        EvalConfig(model=tiny_dlm, task="gsm8k", out=str(tmp_path), data=str(tmp_path / "nope.jsonl"))
    with pytest.raises(ValueError, match="mask-topk"):
        EvalConfig(model=tiny_dlm, task="gsm8k", out=str(tmp_path), mask_topk=(-1,))
    cfg = EvalConfig(model=tiny_dlm, task="gsm8k", out=str(tmp_path), data=GSM8K, limit=1, shots=0,
                     mask_topk=(100000,), gen_length=8, sampler_args={"block_length": 4}, progress=False)
    with pytest.raises(ValueError, match=r"different run \(differs in \['settings'\]"):
        run_eval(EvalConfig(**{**reference_cfg(tiny_dlm, str(Path(run_dir).parents[2])), "gen_length": 4}))
    with pytest.raises(ValueError, match="larger than the sequence"):
        run_eval(cfg)
    assert not list(tmp_path.rglob("samples*.jsonl"))                   # failed before any compute
    rc = main(["eval", "--model", tiny_dlm, "--task", "gsm8k", "--out", str(tmp_path),
               "--data", str(tmp_path / "missing.jsonl")])
    err = capsys.readouterr().err
    assert rc == 2 and "missing.jsonl" in err and "does not exist" in err
    assert main(["eval", "--model", tiny_dlm, "--task", "mmlu", "--out", str(tmp_path)]) == 2
    assert "unknown task" in capsys.readouterr().err


@pytest.mark.slow
def test_smollm2_gsm8k_k0_k1(smollm2, tmp_path):
    """Real weights, real data: SmolLM2 solves nothing (accuracy ~0), but masking its top-1 sink per
    head lowers the likelihood of the reference answer — the measurable effect."""
    cfg = EvalConfig(model="smollm2-135m-instruct", task="gsm8k", out=str(tmp_path), mask_topk=(0, 1), limit=2,
                     data=GSM8K, shots=0, gen_length=8, progress=False)
    dirs = run_eval(cfg, model=smollm2)
    k0, k1 = (records.collect(d) for d in dirs)
    assert [r["id"] for r in k0] == [r["id"] for r in k1] == ["line1", "line2"]
    for r in k0:
        assert r["chat_template"] and r["prompt"].startswith("<|im_start|>") and r["masked"] is None
        assert r["loglik"]["masked"] == r["loglik"]["unmasked"]
    for r in k1:
        assert r["masked"]["steps_masked"] == 7 and r["masked"]["top_positions"][0][0] == 0   # the BOS-side sink
        assert r["loglik"]["masked"] < r["loglik"]["unmasked"]
    ll0 = sum(r["loglik"]["unmasked"] for r in k0) / sum(r["loglik"]["tokens"] for r in k0)
    ll1 = sum(r["loglik"]["masked"] for r in k1) / sum(r["loglik"]["tokens"] for r in k1)
    print(f"SmolLM2 GSM8K (2 problems): acc K=0 {sum(r['correct'] for r in k0)}/2, K=1 "
          f"{sum(r['correct'] for r in k1)}/2; reference log-likelihood per token {ll0:.3f} -> {ll1:.3f}")
    print(open(os.path.join(str(tmp_path), "summary.md")).read())


def test_humaneval_through_runner_and_sandbox(tiny_dlm, tmp_path):
    """HumanEval end to end on the tiny DLM: its (random) code fails in the sandbox, the record says how."""
    cfg = EvalConfig(model=tiny_dlm, task="humaneval", out=str(tmp_path), mask_topk=(0,), limit=1,
                     gen_length=8, sampler_args={"block_length": 4}, progress=False, sandbox_timeout=5)
    (run_dir,) = run_eval(cfg)
    (rec,) = records.collect(run_dir)
    assert rec["id"] == "HumanEval/0" and rec["correct"] is False
    assert rec["extracted"].startswith("from typing import List") and "def has_close_elements" in rec["extracted"]
    assert rec["sandbox"]["isolation"]["mode"] in ("bwrap", "fallback") and rec["verdict"] == rec["sandbox"]["status"]
    assert rec["sandbox"]["isolation"]["proof"] == "nonce after check()"
    assert rec["loglik"]["tokens"] > 0


def test_humaneval_exit_tricks_score_zero_through_run_eval(tiny_dlm, tmp_path, monkeypatch):
    """The issue's case through the whole eval: 1 right completion and 3 wrong ones that exit 0
    (sys.exit in the function, os._exit, atexit(os._exit, 0)) give pass@1 0.25, not 0.75.
    The model is the tiny DLM; its generations are replaced by these four completions."""
    from sinklens.eval import humaneval, runner
    problem = next(p for p in humaneval.load()[0] if p["task_id"] == "HumanEval/2")   # truncate_number
    data = tmp_path / "four.jsonl"
    data.write_text("".join(json.dumps({**problem, "task_id": f"copy/{i}"}) + "\n" for i in range(4)))
    completions = [
        "    return number % 1.0\n",
        "    import sys\n    sys.exit(0)\n",
        "    import os\n    os._exit(0)\n",
        "    import atexit, os\n    atexit.register(os._exit, 0)\n    return 0.0\n",
    ]
    calls = iter(completions)
    monkeypatch.setattr(runner, "generate_sample", lambda *a, **k: (next(calls), []))
    cfg = EvalConfig(model=tiny_dlm, task="humaneval", data=str(data), out=str(tmp_path / "out"),
                     mask_topk=(0,), gen_length=8, sampler_args={"block_length": 4}, progress=False, loglik=False)
    (run_dir,) = run_eval(cfg)
    recs = sorted(records.collect(run_dir), key=lambda r: r["index"])
    assert [r["correct"] for r in recs] == [True, False, False, False], [r["verdict"] for r in recs]
    with open(tmp_path / "out" / "summary.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 1 and float(rows[0]["accuracy"]) == 0.25, rows      # pass@1 in summary.md


@pytest.mark.parametrize("name", [".", ".."])
def test_a_model_named_dot_or_dotdot_keeps_its_runs_inside_out(tiny_dlm, tmp_path, monkeypatch, name):
    """`--model ..` from inside the model's folder: the runs go to OUT/<the folder's name>/, never
    OUT/../ (beside OUT) as the bare path part would put them."""
    work = tmp_path / "work"
    shutil.copytree(tiny_dlm, work / "mymodel")
    here = work / "mymodel" / "sub" if name == ".." else work / "mymodel"
    here.mkdir(exist_ok=True)
    monkeypatch.chdir(here)
    out = tmp_path / "out"
    (run_dir,) = run_eval(EvalConfig(**{**reference_cfg(name, str(out)), "limit": 1, "mask_topk": (0,)}))
    assert Path(run_dir).resolve().parts[:len(out.parts) + 1] == (*out.parts, "mymodel")
    outside = [p for p in tmp_path.rglob("*") if p.is_file() and out not in p.parents]
    assert sorted(p.relative_to(work / "mymodel") for p in outside) == \
        sorted(p.relative_to(tiny_dlm) for p in Path(tiny_dlm).rglob("*") if p.is_file())
