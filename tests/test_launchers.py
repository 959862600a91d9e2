"""Data parallel as users launch it, on CPU with 2 processes: torchrun, `accelerate launch
--multi_gpu --num_processes 2`, and `accelerate launch --num_processes 2` with no accelerate
config (accelerate starts one process there; sinklens relaunches as 2 and says so). Each gives
two ranks that split the samples, and one merged result equal to the single-process run's."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
GSM8K = REPO / ".." / "shared" / "data" / "gsm8k" / "test.jsonl"
ACCELERATE = str(Path(sys.executable).parent / "accelerate")

LAUNCHERS = {
    "torchrun": [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"],
    "accelerate-multi_gpu": [ACCELERATE, "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
                             "--mixed_precision", "no", "--dynamo_backend", "no"],
    "accelerate-default": [ACCELERATE, "launch", "--num_processes", "2", "--num_machines", "1",
                           "--mixed_precision", "no", "--dynamo_backend", "no"],
}


@pytest.mark.slow
@pytest.mark.parametrize("launcher", list(LAUNCHERS))
def test_two_processes_split_the_samples(launcher, tiny_dlm, tmp_path):
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "OMP_NUM_THREADS": "1", "HF_HOME": str(tmp_path / "hf"),  # no accelerate config file
           "CUDA_VISIBLE_DEVICES": ""}
    env.pop("WORLD_SIZE", None), env.pop("RANK", None)
    args = ["eval", "--model", tiny_dlm, "--task", "gsm8k", "--data", str(GSM8K), "--limit", "4", "--shots", "0",
            "--gen-length", "4", "--block-length", "4", "--no-loglik", "--out", str(tmp_path / "out")]
    res = subprocess.run([*LAUNCHERS[launcher], "-m", "sinklens.cli", *args], env=env, capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    run_dir = next((tmp_path / "out").glob("*/gsm8k/k0"))
    for r in (0, 1):  # each rank did its own half
        lines = [json.loads(x) for x in open(run_dir / f"samples.rank{r}.jsonl")]
        assert [x["index"] for x in lines] == [r, r + 2]
    assert len(open(run_dir / "samples.jsonl").read().splitlines()) == 4
    relaunched = "relaunching as 2 processes" in res.stderr
    assert relaunched == (launcher == "accelerate-default")
