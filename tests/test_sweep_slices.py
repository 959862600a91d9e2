"""Which cases of the generated golden sweeps a run takes (tests/conftest.py; docs/install.md, "Testing")."""
import types

import pytest

import conftest


def config(keyword="", args=("tests",)):
    return types.SimpleNamespace(getoption=lambda name: {"keyword": keyword}[name], args=list(args))


@pytest.mark.parametrize("env,keyword,args,want", [
    ("all", "", ("tests",), "all"),
    ("2", "", ("tests",), "2"),
    ("", "bf16_random_05", ("tests",), "all"),  # -k picks from every case
    ("", "", ("tests/test_samplers_official_sweep2.py::test_equals_official_sampler[x]",), "all"),  # a named case
])
def test_the_slice_a_run_takes(monkeypatch, env, keyword, args, want):
    monkeypatch.setenv("SINKLENS_SWEEP_SLICE", env)
    assert conftest._sweep_slice(config(keyword, args)) == want


def test_without_a_choice_the_commit_picks_one_of_the_slices(monkeypatch):
    monkeypatch.delenv("SINKLENS_SWEEP_SLICE", raising=False)
    first = conftest._sweep_slice(config())
    assert first in {str(k) for k in range(conftest.SWEEP_SLICES)} and conftest._sweep_slice(config()) == first


@pytest.mark.parametrize("bad", [str(conftest.SWEEP_SLICES), "-1", "half"])
def test_a_bad_slice_is_refused_in_one_line(monkeypatch, bad):
    monkeypatch.setenv("SINKLENS_SWEEP_SLICE", bad)
    last = conftest.SWEEP_SLICES - 1
    with pytest.raises(pytest.UsageError, match=rf"^SINKLENS_SWEEP_SLICE='{bad}': expected 'all' or 0\.\.{last}$"):
        conftest._sweep_slice(config())


def _item(name, marker=None):
    return types.SimpleNamespace(nodeid=f"tests/test_x.py::{name}",
                                 get_closest_marker=lambda m, marker=marker: m if m == marker else None)


@pytest.mark.parametrize("chosen", ["0", "5", "all"])
def test_slow_tests_and_sweep_cases_rotate_by_slice_and_every_other_test_runs(monkeypatch, chosen):
    """A slice keeps every unmarked test and exactly the slow tests and sweep cases whose id hashes
    to it; the slices together hold every test once; 'all' keeps everything."""
    monkeypatch.setenv("SINKLENS_SWEEP_SLICE", chosen)
    marked = [_item(f"test_{m}_{i}", m) for m in conftest.SLICED_MARKERS for i in range(40)]
    plain = [_item(f"test_plain_{i}") for i in range(10)]
    dropped = []
    cfg = types.SimpleNamespace(getoption=lambda name: "", args=["tests"],
                                hook=types.SimpleNamespace(pytest_deselected=lambda items: dropped.extend(items)))
    items = marked + plain
    conftest.pytest_collection_modifyitems(cfg, items)
    assert all(p in items for p in plain)
    if chosen == "all":
        assert len(items) == 90 and not dropped
        return
    kept = [it for it in marked if it in items]
    assert 0 < len(kept) < len(marked) and len(kept) + len(dropped) == len(marked)
    assert all(conftest.zlib.crc32(it.nodeid.split("::", 1)[1].encode()) % conftest.SWEEP_SLICES == int(chosen)
               for it in kept)
