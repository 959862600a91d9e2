"""float16 traces (the default storage) flip a few Eq. 3 verdicts near ε against float32: every
flip is a cell the analysis marks near the threshold, the Summary says how many, the page marks
the near sinks, and a float32 trace marks none."""
import base64
import json
import re

import numpy as np
import pytest

from sinklens.analysis import analyze
from sinklens.analysis.sinks import near_threshold
from sinklens.trace import TraceWriter

T, L, H, S, EPS = 4, 2, 8, 40, 3.0


def _received(seed=0):
    """(T, L, H, S) column sums of S query rows (each (t, l, h) sums to S) whose key 0 sits within
    ±0.2 % of the Eq. 3 threshold in every head: margin = ε + δ."""
    rng = np.random.default_rng(seed)
    delta = rng.uniform(-0.006, 0.006, (T, L, H, 1))
    others = rng.uniform(0.5, 1.5, (T, L, H, S - 1))
    mean = (S - EPS - delta) / S                                  # the others' mean that makes the sum S
    others *= mean / others.mean(-1, keepdims=True)
    return np.concatenate([mean + EPS + delta, others], axis=-1).astype(np.float32)


def _write(path, received, dtype):
    with TraceWriter(path, {"family": "llada"}, received_dtype=dtype) as w:
        for t in range(T):
            w.write_step(t, tokens=np.arange(S)[None], is_masked=np.zeros((1, S), bool), received=received[t][None])
    return path


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    d = tmp_path_factory.mktemp("near")
    r = _received()
    return (analyze(_write(d / "f16.arrow", r, "float16"), sink_eps=EPS),
            analyze(_write(d / "f32.arrow", r, "float32"), sink_eps=EPS), r, d)


def _cells(a):
    s = a.sinks
    return set(zip(s["step"].tolist(), s["layer"].tolist(), s["head"].tolist(), s["pos"].tolist()))


def test_every_float16_flip_is_marked_near(pair):
    a16, a32, _, _ = pair
    flips = _cells(a16) ^ _cells(a32)
    assert flips                                             # the plant is close enough to ε to flip some
    for a in (a16, a32):                                     # each flip at the margin its own trace gives it
        sk = a.sinks
        for k in range(sk["pos"].size):
            cell = (int(sk["step"][k]), int(sk["layer"][k]), int(sk["head"][k]), int(sk["pos"][k]))
            if cell in flips:
                assert near_threshold(sk["score"][k], sk["margin"][k], EPS), cell
    near = a16.near_threshold
    assert near.cells.sum() >= len(flips) and near.cells.sum() < 2 * T * L * H  # key 0 only (±1 rounding cell)
    assert a32.near_threshold is None                        # float32 storage: nothing to mark
    row = dict(a16.summary_rows())["near ε (float16)"]
    assert row.startswith(f"{int(near.cells.sum())} (layer, head, key) cells")


def test_page_marks_the_near_sinks(pair, tmp_path):
    from sinklens.report.report import ReportOptions, build_report

    a16, _, _, d = pair
    rep = build_report([d / "f16.arrow"], tmp_path / "r", options=ReportOptions(figures=False, progress=False))
    head = json.loads(re.search(r'id="sl-head-0">(.*?)</script>', rep.html.read_text()).group(1).replace("\\u003c", "<"))
    near = np.frombuffer(base64.b64decode(head["sinks"]["near"]), np.uint8)
    s = a16.sinks
    want = near_threshold(s["score"], s["margin"], EPS)
    assert near.size == want.size and near.sum() == want.sum() > 0
