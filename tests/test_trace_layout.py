"""The trace layout (causal, prompt length, blocks, query rows): written by each sampler, read by the
analysis from the layout alone, derived for traces written before it existed."""
import numpy as np
import pytest
import torch

import sinklens
from sinklens.analysis import AnalysisInputError, analyze
from sinklens.trace import TraceLayout, TraceWriter

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def models(fixtures_dir):
    return {"llada": sinklens.load(fixtures_dir / "llada"), "dream": sinklens.load(fixtures_dir / "dream"),
            "arm": sinklens.load("tiny-arm", dtype="float32")}


@pytest.mark.parametrize("family,kwargs,expected", [
    ("llada", dict(steps=4, gen_length=8, block_length=4), TraceLayout(False, 5, 4, "all")),
    ("llada", dict(steps=2, gen_length=8, block_length=8), TraceLayout(False, 5, None, "all")),  # one block
    ("dream", dict(steps=2, max_new_tokens=6), TraceLayout(False, 5, None, "all")),
    ("arm", dict(max_new_tokens=3), TraceLayout(True, 5, None, "newest")),
])
def test_each_sampler_writes_its_layout_and_analysis_reads_it(models, tmp_path, family, kwargs, expected):
    ids = torch.randint(1, 90, (1, 5), generator=torch.Generator().manual_seed(0))
    out = models[family].generate(ids, trace=tmp_path / "t.arrow", **kwargs)
    assert TraceLayout(**out.trace.meta["layout"]) == expected
    assert analyze(out.trace_path).source.layout == expected


def _write(path, meta, S=12):
    rng = np.random.default_rng(0)
    with TraceWriter(path, {"num_layers": 1, "num_heads": 2, **meta}) as w:
        for t in range(3):
            w.write_step(t, rng.integers(0, 50, (1, S)), received=rng.random((1, 1, 2, S)) * S)
    return path


def test_analysis_reads_the_layout_not_the_sampler_arguments(tmp_path):
    """A sampler sinklens has never heard of: its arguments mean nothing; the layout says it all."""
    layout = TraceLayout(causal=False, prompt_length=4, block_length=2, query_rows="all")
    path = _write(tmp_path / "t.arrow", {"family": "newfam", "sampler": {"name": "x", "args": {"block_length": 99}},
                                         "layout": layout.to_meta()})
    a = analyze(path)
    assert a.source.layout == layout and (a.source.block_length, a.source.prompt_length) == (2, 4)


@pytest.mark.parametrize("meta,expected", [
    # before `layout`: causal / prompt_length at the top level, blocks only in LLaDA's arguments
    ({"causal": False, "prompt_length": 4, "sampler": {"name": "llada", "args": {"gen_length": 8, "block_length": 4}}},
     TraceLayout(False, 4, 4, "all")),
    ({"causal": True, "prompt_length": 4, "arm_query_rows": "prefix"}, TraceLayout(True, 4, None, "prefix")),
    ({"causal": False, "prompt_length": 4, "block_length": 2}, TraceLayout(False, 4, 2, "all")),  # for a while
    # older still: no `causal`; prompt length from seq_len - gen_length; only the ARM sampler was causal
    ({"family": "llada", "sampler": {"name": "llada", "args": {"gen_length": 8, "block_length": 8}}},
     TraceLayout(False, 4, None, "all")),
    ({"family": "llama", "sampler": {"name": "arm", "args": {"max_new_tokens": 3}}},
     TraceLayout(True, None, None, "newest")),
    ({}, TraceLayout(False, None, None, "all")),
])
def test_older_traces_get_their_layout_derived(tmp_path, meta, expected):
    assert analyze(_write(tmp_path / "t.arrow", meta)).source.layout == expected


def test_bad_layouts_are_one_clear_error(tmp_path):
    with pytest.raises(ValueError, match="query_rows must be one of"):
        TraceLayout(query_rows="some")
    with pytest.raises(ValueError, match="block_length must be a non-negative int"):
        TraceLayout(block_length=2.5)
    path = _write(tmp_path / "t.arrow", {"layout": {"causal": False, "prompt_length": -3}})
    with pytest.raises(AnalysisInputError, match="bad layout metadata: prompt_length"):
        analyze(path)
