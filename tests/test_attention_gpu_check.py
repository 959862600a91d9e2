"""benchmarks/gpu_check.py in its CPU-sized smoke mode: every part runs, and what it reports holds.

The GPU numbers need a GPU; here the tiny shapes check the code paths the full check takes (the
routes against eager attention on every layout, the capture-cost loop, the plain / traced /
masked LLaDA generations through SinkModel) and that the routes agree with eager attention.
"""
import importlib.util
import re
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location("gpu_check", Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_check.py")
gpu_check = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gpu_check)


@pytest.mark.slow
def test_smoke_mode_runs_every_part_and_the_routes_agree_with_eager(capsys):
    gpu_check.main(["--smoke"])
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("| ll")]
    checks = [r for r in rows if any(f"| {layout} |" in r for layout in gpu_check.LAYOUTS)]
    assert len(checks) == 2 * len(gpu_check.SMOKE_SHAPES) * len(gpu_check.LAYOUTS)   # bf16 and fp32
    for row in checks:
        dtype = row.split("|")[2].strip()
        lse = row.split("|")[4].strip()   # the lse route takes every layout
        received, logits = (float(x) for x in re.findall(r"[0-9.]+e[-+][0-9]+", lse))
        # bf16: eager's own maps are bf16 (3 significant digits), summed over 64 rows
        assert received <= (0.1 if dtype == "bfloat16" else 1e-4), row
        assert logits <= (0.1 if dtype == "bfloat16" else 1e-4), row
        assert lse.endswith("/ yes"), row   # the lse route's output is sdpa's, bit for bit
    costs = [r for r in rows if re.match(r"\| ll\w+-\db \| 64 \|", r)]
    assert len(costs) == len(gpu_check.SMOKE_SHAPES)
    modes = [mode for mode, _ in gpu_check.GEN_MODES]
    gens = [r for r in rows if r.startswith("| llada-8b | ") and r.split("|")[2].strip() in modes]
    assert [r.split("|")[2].strip() for r in gens] == modes
    assert all(int(r.split("|")[3]) == 8 for r in gens)   # every mode made its 8 steps
    same = {r.split("|")[2].strip(): r.split("|")[7].strip() for r in gens}
    # tracing did not change the generation; a masked one is the same whichever route records it
    assert same == {"plain": "-", "trace": "plain: yes", "trace-lse": "plain: yes", "mask": "-", "mask-lse": "mask: yes"}
