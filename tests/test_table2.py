"""`sinklens replicate --table2 --model M`: the paper's Table 2 protocol on a shipped twin (one
generation here; the protocol's 30 by default), beside the paper's rows."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sinklens.experiments.table2 import BLOCK, PAPER_TABLE2, table2

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    out = tmp_path_factory.mktemp("table2")
    return out, table2("tiny-dlm", out, n=1, progress=False, load_kwargs={"dtype": "float32"})


@pytest.mark.slow
def test_measured_row_beside_the_papers(measured):
    out, res = measured
    rows = {r["model"]: r for r in res["rows"]}
    assert [m for m in rows if "measured" in m] == ["tiny-dlm (measured, n = 1)"]
    for name, ref in PAPER_TABLE2.items():
        assert rows[f"{name} (the paper, arXiv 2510.15731v2, Table 2)"]["top"] == ref
    top = rows["tiny-dlm (measured, n = 1)"]["top"]
    fractions = [f for _, f in top]
    assert len(top) == 5 and fractions == sorted(fractions, reverse=True) and 0 < sum(fractions) <= 1
    md = (out / "table2.md").read_text()
    assert "LLaDA-8B" in md and "Dream-7B" in md and "MMaDA-8B" in md and "`Ċ` 0.368" in md
    saved = json.loads((out / "table2.json").read_text())
    # the protocol, cut to the twin's 128-token context in whole blocks of 32, one token per step
    s = saved["settings"]
    assert s["block_length"] == BLOCK and s["steps"] == s["gen_length"] and s["gen_length"] % BLOCK == 0
    assert any("context is 128" in n for n in saved["notes"])


def test_rerun_reads_the_kept_traces(measured):
    out, res = measured
    traces = sorted((out / "traces").glob("*.arrow"))
    assert len(traces) == 1
    before = traces[0].stat().st_mtime_ns
    again = table2("tiny-dlm", out, n=1, progress=False, load_kwargs={"dtype": "float32"})
    assert traces[0].stat().st_mtime_ns == before and again["rows"] == res["rows"]


@pytest.mark.parametrize("args, said", [(["--table2"], "--table2 and --model go together"),
                                        (["--table2", "--model", "tiny-arm"], "Table 2 is measured on diffusion")])
@pytest.mark.slow
def test_bad_use_is_one_line(tmp_path, args, said):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    r = subprocess.run([sys.executable, "-m", "sinklens", "replicate", *args, "--out", str(tmp_path / "o")],
                       capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode != 0 and said in r.stderr and "Traceback" not in r.stderr
