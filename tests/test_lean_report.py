"""`sinklens report` stays lean: no torch / transformers import, and a trace read step by step
does not stay resident (benchmarks/bench_report_memory.py measures the peak; here only the
mechanisms are checked, against the trace's own data)."""
import subprocess
import sys

import numpy as np
import pytest

from sinklens.trace import TraceWriter, open_trace


def _trace(path, steps=4, shape=(2, 3, 16)):
    rng = np.random.default_rng(0)
    L, H, S = shape
    with TraceWriter(path, {"family": "llada", "query_groups": ["masked", "unmasked"]}) as w:
        for t in range(steps):
            g = rng.random((1, 2, L, H, S)).astype(np.float32)
            g[..., 0] += 5
            w.write_step(t, tokens=rng.integers(0, 50, (1, S)), is_masked=rng.random((1, S)) < 0.5,
                         received=g.sum(1), received_groups=g)
    return path


@pytest.mark.slow
def test_report_imports_neither_torch_nor_transformers_nor_pandas(tmp_path):
    """pandas too: pyarrow's `to_numpy` imports it (~45 MB of a report's fixed cost; trace.reader.as_numpy)."""
    trace = _trace(tmp_path / "t.arrow")
    code = ("import sys; from sinklens.cli import main; "
            f"rc = main(['report', {str(trace)!r}, '--out', {str(tmp_path / 'rep')!r}, '--quiet', '--no-figures']); "
            "print(sorted(m for m in ('torch', 'transformers', 'pandas') if m in sys.modules)); sys.exit(rc)")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.strip().splitlines()[-1] == "[]"
    assert (tmp_path / "rep" / "summary.json").is_file()


def test_as_numpy_equals_pyarrow_on_every_type_and_offset():
    """The trace reader's own arrow -> numpy (no pandas import) gives pyarrow's values, sliced arrays too."""
    import pyarrow as pa

    from sinklens.trace.reader import as_numpy

    rng = np.random.default_rng(0)
    for values in (rng.integers(-9, 9, 37).astype(np.int32), rng.integers(0, 9, 37), rng.random(37).astype(np.float16),
                   rng.random(37).astype(np.float32), rng.random(37) < 0.5):
        arr = pa.array(values)
        for start, n in ((0, 37), (3, 20), (9, 0), (13, 24)):
            part = arr.slice(start, n)
            got = as_numpy(part)
            assert got.dtype == values.dtype and np.array_equal(got, values[start:start + n])
    with_null = pa.array([1.5, None, 2.0], pa.float32())
    assert np.isnan(as_numpy(with_null)[1]) and as_numpy(with_null)[2] == 2.0


def test_released_pages_read_back_the_same(tmp_path):
    t = open_trace(_trace(tmp_path / "t.arrow"))
    before = [(t.tokens(s).copy(), t.received(s)) for s in t.steps]
    views = [t.tokens(s) for s in t.steps]          # zero-copy views into the mapped file
    t.release_pages()
    for (tokens, received), view, s in zip(before, views, t.steps):
        np.testing.assert_array_equal(view, tokens)
        np.testing.assert_array_equal(t.received(s), received)
    t.close()
