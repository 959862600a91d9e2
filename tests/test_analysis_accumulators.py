"""Analyses as accumulators: a new one is a class with add/result/to_dict plus one list entry, and
it sees every step with the scores and Eq. 3 flags the built-in ones use."""
import importlib
import json

import numpy as np
import pytest

import _planted as P
from sinklens.analysis import analyze
from sinklens.analysis.accumulate import Accumulator, Step

A = importlib.import_module("sinklens.analysis.analyze")   # the module (the package exports the function)


class MaxScore(Accumulator):
    """The highest real-key score per step (a made-up analysis)."""

    name = "max_score"

    def __init__(self, source, config):
        self.values = np.zeros(source.num_steps)

    def add(self, step: Step) -> None:
        self.values[step.index] = step.scores[..., step.data.key_mask].max()

    def result(self) -> dict:
        return {self.name: self.values}

    def to_dict(self) -> dict:
        return {self.name: self.values.round(4).tolist()}


def test_a_new_accumulator_is_one_list_entry(monkeypatch):
    base = analyze(P.source())
    monkeypatch.setattr(A, "ACCUMULATORS", A.ACCUMULATORS + [MaxScore])
    a = analyze(P.source())
    expected = [a.step_scores(t)[..., a.key_mask[t]].max() for t in range(a.num_steps)]
    np.testing.assert_allclose(a.extra["max_score"], expected)
    d = a.to_dict()
    assert d["max_score"] == pytest.approx(expected, abs=1e-4)
    # the built-in analyses are untouched by the new one
    del d["max_score"]
    assert json.dumps(d) == json.dumps(base.to_dict())
    np.testing.assert_array_equal(a.largest_pos, base.largest_pos)


def test_an_analysis_of_your_own_without_editing_sinklens():
    a = analyze(P.source(), extra=[MaxScore])
    assert a.extra["max_score"].shape == (a.num_steps,) and "max_score" in a.to_dict()
    assert "max_score" not in analyze(P.source()).extra


def test_every_builtin_follows_the_protocol():
    a = analyze(P.source())
    assert [type(acc) for acc in a.accumulators] == A.ACCUMULATORS and a.extra == {}
    for acc in a.accumulators:
        assert isinstance(acc, Accumulator) and acc.name
        assert all(hasattr(a, k) for k in acc.result()), acc.name     # it fills named Analysis attributes
        json.dumps(acc.to_dict())                                      # and its part of to_dict() is JSON
