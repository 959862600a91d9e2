"""The half-precision golden fixtures record the CPU kernels that made them, and a case is compared on them.

tests/_kernels.py says why (bfloat16 tokens depend on the matmul kernel: AMX-BF16 vs AVX2), tests/conftest.py
how: here, where this process computes the fixture's bits; else in a child pytest pinned to the record's
kernels, where a mismatch is an xfail naming both. This file checks the records, and the routing on a case that
changes with the kernel: ATen's DEFAULT (no AVX2/FMA) kernels stand in for another CPU's.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import _kernels

TESTS = Path(__file__).resolve().parent
# a bfloat16 LLaDA-MoE case whose tokens differ under ATen's DEFAULT kernels (measured here)
FLIPS = "tests/test_llada_moe.py::test_bf16_generate_token_exact[bf16_generate_semi_ar-plain]"


def half_precision_files():
    for path in sorted((TESTS / "fixtures").rglob("*.json")):
        meta = json.loads(path.read_text())
        if isinstance(meta, dict) and any(c.get("dtype", meta.get("dtype")) in _kernels.HALF
                                          for c in meta.get("cases", [])):
            yield path, meta


def test_every_half_precision_fixture_records_its_kernels():
    files = list(half_precision_files())
    assert len(files) >= 11
    for path, meta in files:
        assert set(_kernels.RECORD_FIELDS) <= set(meta.get("kernels", {})), f"{path.name}: no kernels record"


def test_the_record_is_this_cpus_where_the_facts_are_the_same():
    """A stale probe (the probe's code changed, or a torch update changed a kernel) would send every case
    to the xfail path on the very CPU that made the fixtures: where torch, the ATen capability and the
    oneDNN choice are the record's, the digest must be too (where one was recorded)."""
    here = _kernels.record()
    for path, meta in half_precision_files():
        rec = meta["kernels"]
        same = all(here[k] == rec[k] for k in ("torch", "aten_cpu_capability", "onednn_bf16_gemm"))
        if not same or rec["probe"] is None:
            pytest.skip(f"this CPU's kernels are not the fixtures' ({_kernels.describe(here)})")
        assert here["probe"] == rec["probe"], path.name


@pytest.mark.slow
def test_the_probe_sees_a_kernel_change():
    """What the routing keys on: ATen's DEFAULT kernels give other bits than this process's."""
    out = subprocess.run([sys.executable, str(TESTS / "_kernels.py")], capture_output=True, text=True, check=True,
                         env={**os.environ, "ATEN_CPU_CAPABILITY": "default"})
    other = json.loads(out.stdout)
    assert other["aten_cpu_capability"] == "DEFAULT" and other["probe"] != _kernels.record()["probe"]


def _pytest(env: dict, *args) -> subprocess.CompletedProcess:
    env = {**os.environ, **env}
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args], env=env,
                          cwd=TESTS.parent, capture_output=True, text=True)


@pytest.mark.slow
def test_a_case_that_depends_on_the_kernels_is_compared_on_the_fixtures():
    """Under other kernels the case fails when compared in-process (SINKLENS_TEST_KERNELS=native): its tokens
    depend on the kernel. Routed, it runs in a child pytest pinned to the record's kernels: it passes where the
    pin reproduces them, else it is an xfail whose one line names both kernels."""
    other = {"ATEN_CPU_CAPABILITY": "default"}
    native = _pytest({**other, "SINKLENS_TEST_KERNELS": "native"}, FLIPS)
    assert native.returncode == 1 and "1 failed" in native.stdout, native.stdout[-2000:]
    routed = _pytest(other, "-rx", FLIPS)
    assert routed.returncode == 0, routed.stdout[-2000:]
    xfail = [ln for ln in routed.stdout.splitlines() if ln.startswith("XFAIL")]
    assert "1 passed" in routed.stdout or (len(xfail) == 1 and "kernels differ by CPU" in xfail[0]), routed.stdout


def test_where_no_pin_reproduces_the_kernels_a_mismatch_says_so_in_one_line():
    """An xfail naming both kernels, with the assertion's first line."""
    import conftest

    class Case:
        def runtest(self):
            raise AssertionError("step 4 differs from the official sampler\nassert 4 is None")

    case = Case()
    conftest._compare_or_xfail(case, "kernels differ by CPU: here X; the fixture was made with Y")
    with pytest.raises(pytest.xfail.Exception, match=r"^kernels differ by CPU: .* \(step 4 differs [^\n]*\)$"):
        case.runtest()
