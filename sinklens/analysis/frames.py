"""pandas DataFrames of analysis results (for notebooks); pandas is imported only when asked for.

    a.token_table.to_dataframe()   # Table 2: token, token_id, category, count, fraction
    a.sinks_frame()                # one row per Eq. 3 sink occurrence (step, layer, head, position)
    a.heads_frame()                # one row per (layer, head): class, tracks, moves, splits
"""
from __future__ import annotations

import numpy as np


def pandas():
    try:
        import pandas as pd
    except ImportError:
        raise ImportError("DataFrames need pandas: pip install pandas (or the sinklens[notebook] extra)") from None
    return pd


def token_frame(table):
    """SinkTokenTable -> DataFrame, most frequent sink token first."""
    pd = pandas()
    return pd.DataFrame([r.__dict__ for r in table.rows], columns=["token", "token_id", "category", "count", "fraction"])


def sinks_frame(a):
    """Analysis -> DataFrame of every Eq. 3 sink occurrence, with the token under it."""
    pd = pandas()
    s = a.sinks
    step = s["step"].astype(np.int64)
    pos = s["pos"].astype(np.int64)
    ids = a.tokens[step, pos] if step.size else np.zeros(0, np.int64)
    uniq = np.unique(ids)
    text = dict(zip(uniq.tolist(), a.source.decode(uniq.tolist()))) if uniq.size else {}
    return pd.DataFrame({
        "step_index": step, "step": np.asarray(a.step_numbers, np.int64)[step] if step.size else step,
        "layer": s["layer"].astype(np.int64), "head": s["head"].astype(np.int64), "pos": pos,
        "token": [text[int(i)] for i in ids], "token_id": ids,
        f"score_{a.units}": s["score"].astype(np.float64), f"margin_{a.units}": s["margin"].astype(np.float64),
    })


def heads_frame(a):
    """Analysis -> DataFrame with one row per (layer, head) (Analysis.head_summaries)."""
    return pandas().DataFrame(a.head_summaries())
