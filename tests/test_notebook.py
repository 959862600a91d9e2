"""docs/notebook.ipynb executed the way Jupyter runs it (nbclient + an IPython kernel), so it cannot rot.

The kernel inherits this process' environment (PYTHONPATH included), so it imports the sinklens
under test. Its wall time is printed (target < 30 s on the CI machine), not asserted.
"""
import re
import time
from pathlib import Path

import pytest

NOTEBOOK = Path(__file__).resolve().parents[1] / "docs" / "notebook.ipynb"


def _html(cell) -> str:
    return "".join(o.get("data", {}).get("text/html", "") for o in cell.get("outputs", []))


@pytest.mark.slow
def test_notebook_runs_offline_and_shows_what_it_says(tmp_path):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    t0 = time.time()
    nbclient.NotebookClient(nb, timeout=120, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}}).execute()
    print(f"notebook executed in {time.time() - t0:.1f} s")
    code = [c for c in nb.cells if c.cell_type == "code"]
    errors = [o for c in code for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors
    stderr = "".join(o.get("text", "") for c in code for o in c.get("outputs", []) if o.get("name") == "stderr")
    assert "Warning" not in stderr, stderr   # e.g. tqdm's "IProgress not found" where the extra lacked ipywidgets
    summary = _html(next(c for c in code if c.source.strip().endswith("\na")))
    assert "strongest-sink head" in summary and len(summary) < 5000            # a summary, not 122 KB
    frames = [c for c in code if "to_dataframe()" in c.source or "sinks_frame()" in c.source]
    assert all("<table" in _html(c) for c in frames)                          # pandas DataFrames
    figs = [c for c in code if c.source.lstrip().startswith(("from sinklens.report import figures", "F.", "arm ="))]
    assert all(any("image/png" in o.get("data", {}) for o in c.outputs) for c in figs) and len(figs) == 3
    pages = [_html(c) for c in code if "sinklens.show(" in c.source]
    prefixes = [set(re.findall(r'id="(sl[0-9a-f]{10})-page"', p)) for p in pages]
    assert len(pages) == 2 and all(len(p) == 1 for p in prefixes) and prefixes[0] != prefixes[1]


def test_reprs_are_short_and_tables_are_dataframes():
    import numpy as np

    import _planted as P
    from sinklens.analysis import analyze

    a = analyze(P.source())
    assert len(repr(a)) < 300 and "strongest head L" in repr(a)
    assert len(a._repr_html_()) < 5000 and "<table>" in a._repr_html_()
    assert len(repr(a.token_table)) < 300
    tok = a.token_table.to_dataframe()
    assert list(tok.columns) == ["token", "token_id", "category", "count", "fraction"]
    assert tok["count"].sum() == a.token_table.total == int(a.sink_count.sum())
    sinks = a.sinks_frame()
    assert len(sinks) == int(a.sink_count.sum())
    # the planted static sink of (0, 0) sits on token 0 (<|startoftext|>) at every step
    s00 = sinks[(sinks.layer == 0) & (sinks["head"] == 0)]
    assert set(s00.pos) == {0} and set(s00.token) == {P.VOCAB[0]} and len(s00) == P.T
    assert np.all(sinks[f"margin_{a.units}"] >= a.config.sink_eps)
    assert len(a.heads_frame()) == P.L * P.H


def test_page_view_outside_ipython_is_a_fragment_with_its_own_ids():
    import _planted as P
    from sinklens.report.show import PageView, page_view

    v1, v2 = page_view(P.source()), page_view(P.source())
    assert isinstance(v1, PageView) and "<html" not in v1.html and v1._repr_html_() == v1.html
    ids1 = set(re.findall(r'id="(sl[0-9a-f]{10})-', v1.html))
    ids2 = set(re.findall(r'id="(sl[0-9a-f]{10})-', v2.html))
    assert len(ids1) == len(ids2) == 1 and ids1 != ids2
