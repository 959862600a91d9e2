"""Sink analysis on a saved trace alone (numpy only; no model, no torch). See docs/analysis.md.

    from sinklens.analysis import analyze, scores, is_sink
    a = analyze("run.arrow", units="scaled_sum", sink_eps=3)    # the defaults (sinklens/rule/spec.py)
"""
from sinklens.analysis.accumulate import Accumulator, Step
from sinklens.analysis.analyze import Analysis, AnalysisConfig, analyze
from sinklens.analysis.dynamics import SinkTrack, classify_track, track_sinks
from sinklens.analysis.scores import UNITS, scores, uniform_expectation
from sinklens.analysis.sinks import eps_sweep, is_sink, largest_sink, sink_margin, top_k
from sinklens.analysis.source import AnalysisInputError, ArraySource, Source, TraceSource, as_source
from sinklens.analysis.tokens import categorize, sink_token_table
from sinklens.rule.spec import DEFAULT_EPS

__all__ = ["Accumulator", "Analysis", "AnalysisConfig", "AnalysisInputError", "ArraySource", "DEFAULT_EPS", "SinkTrack", "Source",
           "Step", "TraceSource", "UNITS", "analyze", "as_source", "categorize", "classify_track", "eps_sweep", "is_sink",
           "largest_sink", "scores", "sink_margin", "sink_token_table", "top_k", "track_sinks",
           "uniform_expectation"]
