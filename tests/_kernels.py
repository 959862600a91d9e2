"""Which CPU kernels a golden fixture's half-precision outputs were made with, and whether this process has them.

The official code wrote the bfloat16 / float16 fixtures on one CPU, with AVX-512: an Intel Xeon reproduces them
with oneDNN's bf16 gemm capped at AVX512_CORE_VNNI; its default AMX-BF16 kernel adds the products in another
order, and so does ATen's own AVX2 gemm on an AVX2-only AMD EPYC. One rounding step of bfloat16 (2^-8) then
moves a confidence across a tie and the official tokens differ: the comparison is with the kernels, not with
sinklens. So every such fixture file records the kernels that made it ("kernels", RECORD_FIELDS; the digest
`probe` was not taken when they were made: null) and tests/conftest.py compares a half-precision case where
this process computes the recorded digest, else in a child process pinned to the record's kernels (its "pin":
environment variables read once when torch starts), where a mismatch on kernels not confirmed to be the
fixture's is an xfail that names both.
"""
from __future__ import annotations

import functools
import hashlib
import os
from pathlib import Path

HALF = ("bfloat16", "float16")
RECORD_FIELDS = ("torch", "cpu", "isa", "aten_cpu_capability", "onednn_bf16_gemm", "threads", "probe", "pin")


def probe() -> str:
    """A digest of the half-precision ops whose bits depend on the CPU's kernels, at the tiny fixtures' shapes
    (hidden 64, head_dim 16, K 16-128, vocabulary 320): linear and batched matmul (ATen's own gemm or oneDNN's),
    sdpa with and without a mask (the fused CPU kernel), and the float32 softmax and mean of squares of the
    upcast norms (ATen's vector width). One thread, as the fixtures were made. float32 matmuls are left out:
    MKL picks their code path by CPU and no setting reproduces one CPU's on another (none moved a token of
    these fixtures on an AMX machine, whose oneDNN bf16 kernel did)."""
    import torch
    import torch.nn.functional as F

    threads, digest = torch.get_num_threads(), hashlib.sha256()
    torch.set_num_threads(1)

    def add(*tensors):
        for t in tensors:
            digest.update(t.contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    try:
        g = torch.Generator().manual_seed(0)
        for dtype in (torch.bfloat16, torch.float16):
            for rows, k, n in ((1, 64, 320), (7, 16, 64), (40, 64, 96), (40, 96, 64), (40, 128, 64), (7, 32, 64)):
                x, w = torch.randn(rows, k, generator=g).to(dtype), torch.randn(n, k, generator=g).to(dtype)
                y = F.linear(x, w)  # (rows, n)
                add(y, torch.bmm(x[None], w.T[None]), y.float().softmax(-1), x.float().pow(2).mean(-1))
            q, kk, v = (torch.randn(2, 4, 24, 16, generator=g).to(dtype) for _ in range(3))  # (B, heads, S, head_dim)
            causal = torch.ones(2, 1, 24, 24, dtype=torch.bool).tril()
            add(*(F.scaled_dot_product_attention(q, kk, v, attn_mask=m) for m in (None, causal)))
    finally:
        torch.set_num_threads(threads)
    return digest.hexdigest()[:16]


def cpu() -> tuple[str, list[str]]:
    """This CPU's model name and the instruction-set extensions that pick a half-precision kernel."""
    lines = Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").is_file() else []
    field = lambda key: next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith(key)), "")  # noqa: E731
    flags = set(field("flags").split())
    return field("model name") or "unknown", sorted(flags & ISA_FLAGS)


ISA_FLAGS = {"avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni", "avx512_bf16",
             "avx512_fp16", "avx_vnni", "avx_ne_convert", "amx_tile", "amx_bf16", "amx_fp16"}


def onednn_bf16_gemm() -> bool:
    """Whether torch hands bfloat16 matmuls to oneDNN here: it does where oneDNN's ISA (capped by
    ONEDNN_MAX_CPU_ISA) reaches AVX-512 (avx512bw/vl/dq) or AVX-NE-CONVERT, and mkldnn is enabled."""
    import torch

    isa = set(cpu()[1])
    capable = {"avx512bw", "avx512vl", "avx512dq"} <= isa or "avx_ne_convert" in isa
    capped = os.environ.get("ONEDNN_MAX_CPU_ISA", "ALL").upper() in {"SSE41", "AVX", "AVX2", "AVX2_VNNI"}
    return bool(capable and not capped and torch.backends.mkldnn.is_available() and torch.backends.mkldnn.enabled)


@functools.cache
def record() -> dict:
    """This process's kernels in the fixtures' "kernels" form (what a fixture script made here writes)."""
    import torch

    name, isa = cpu()
    cap, onednn = torch.backends.cpu.get_cpu_capability(), onednn_bf16_gemm()
    return {"torch": torch.__version__, "cpu": name, "isa": isa, "aten_cpu_capability": cap,
            "onednn_bf16_gemm": onednn, "threads": 1, "probe": probe(),
            # what makes another x86-64 CPU run these kernels (read once, when torch starts)
            "pin": {"ATEN_CPU_CAPABILITY": cap.lower(), **({} if onednn else {"ONEDNN_MAX_CPU_ISA": "AVX2"})}}


def describe(rec: dict) -> str:
    """One line: the kernels a record names."""
    return (f"torch {rec['torch']}, {'/'.join(rec['isa'])}, ATen {rec['aten_cpu_capability']}, "
            f"{'oneDNN' if rec['onednn_bf16_gemm'] else 'no oneDNN'} bf16 gemm, probe {rec['probe'] or 'not recorded'}")


def param(*values, id: str, dtype: str, kernels: dict | None):
    """A pytest param; a half-precision golden case carries the kernels its fixture file records, and
    tests/conftest.py compares it on them."""
    import pytest

    if dtype not in HALF:
        return pytest.param(*values, id=id)
    assert kernels, f"{id}: a half-precision fixture file records the kernels that made it (tests/_kernels.py)"
    return pytest.param(*values, id=id, marks=pytest.mark.fixture_kernels(kernels))


if __name__ == "__main__":  # what a fixture made on this machine records
    import json

    print(json.dumps(record()))
