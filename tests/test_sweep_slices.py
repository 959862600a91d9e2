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


@pytest.mark.parametrize("bad", ["4", "-1", "half"])
def test_a_bad_slice_is_refused_in_one_line(monkeypatch, bad):
    monkeypatch.setenv("SINKLENS_SWEEP_SLICE", bad)
    with pytest.raises(pytest.UsageError, match=rf"^SINKLENS_SWEEP_SLICE='{bad}': expected 'all' or 0\.\.3$"):
        conftest._sweep_slice(config())
