"""The corpus report (`sinklens report CORPUS.jsonl` or the run folder): HTML tables, the
per-(layer, head) totals browsable beside the control's, figures whose colour scales put an
all-zero control at zero, and the page judged in headless Chromium at 1366 and 1920 px.

The corpus files are written here from planted traces (tests/_planted.py) through the same
`prompt_part` a corpus run streams, so no model is loaded; the ground truth is the plant's Eq. 3
sinks recomputed from its column sums, not the report code.
"""
from __future__ import annotations

import json
import re

import numpy as np
import pytest

import _planted as P
from sinklens.analysis import ArraySource, analyze
from sinklens.analysis.analyze import DEFAULT_EPS_VALUES, HIST_EDGES
from sinklens.analysis.corpus import prompt_part, to_json
from sinklens.report import corpus_figures as CF
from sinklens.report.corpus import build_corpus_report


def _write_corpus(path, sources, *, model="planted", random_init=None):
    """A corpus file of the given traces, one prompt each (the format sinklens/analysis/corpus.py reads)."""
    a0 = analyze(sources[0])
    head = {"sinklens_corpus": 1, "model": model, "random_init": random_init, "family": "llada", "causal": False,
            "num_layers": a0.num_layers, "num_heads": a0.num_heads, "sampler": "llada", "settings": {},
            "units": a0.units, "sink_eps": a0.config.sink_eps, "eps_values": [float(e) for e in DEFAULT_EPS_VALUES],
            "hist_edges": [float(e) for e in HIST_EDGES], "prompts_file": "prompts.jsonl", "kept_traces": [],
            "skipped": []}
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        f.write(json.dumps(head) + "\n")
        for i, src in enumerate(sources):
            a = analyze(src)
            f.write(json.dumps({"index": i, "id": f"p{i}", "line": i + 1, "steps": a.num_steps,
                                "parts": {a.units: to_json(prompt_part(a))}}) + "\n")
    return path


def _uniform_source():
    """The plant's shape with every key scoring alike: no Eq. 3 sink anywhere (an all-zero field)."""
    d = P.build(with_maps=False)
    return ArraySource(np.ones_like(d["received"]), d["tokens"], is_masked=d["is_masked"], vocab=P.VOCAB,
                       mask_id=P.MASK_ID, label="uniform")


@pytest.fixture(scope="module")
def corpora(tmp_path_factory):
    d = tmp_path_factory.mktemp("corpus")
    run = _write_corpus(d / "run" / "corpus.jsonl", [P.source(seed=s, with_maps=False) for s in range(3)])
    ctrl = _write_corpus(d / "ctrl" / "corpus.jsonl", [_uniform_source() for _ in range(2)], random_init=7)
    return run, ctrl


def _planted_sink_rate() -> np.ndarray:
    """(L, H) share of (prompt, step) with an Eq. 3 sink, from the plant's column sums (3 prompts)."""
    hits = []
    for s in range(3):
        r = P.build(seed=s, with_maps=False)["received"]                          # (T, L, H, S)
        n = r.shape[-1]
        scaled = r * n / r.sum(-1, keepdims=True)                                   # average key scores 1
        margin = scaled - (scaled.sum(-1, keepdims=True) - scaled) / (n - 1)
        hits.append((margin >= 3.0).any(-1))                                        # (T, L, H)
    return np.concatenate(hits).mean(0)


@pytest.mark.slow
def test_corpus_page_is_html_tables_with_the_control_beside(corpora, tmp_path):
    run, ctrl = corpora
    rep = build_corpus_report(run, tmp_path / "r", control=ctrl)
    page = rep.html.read_text()
    assert "<pre>" not in page and "| --- |" not in page and "|---" not in page      # no raw Markdown
    assert page.count("<table") >= 8 and "class='sl-viewer sl-card'" in page
    assert "viewer.css" not in page and ".sl-page header" in page                   # the trace page's style, inlined
    # the readouts' and Table 2's corpus and control tables sit side by side (two columns)
    assert re.search(r"<h3>Sink tokens</h3>.*?<div class='sl-beside' style='--k:2'>", page, re.S)
    # per-(layer, head) panel: the corpus' sink rate is the plant's, the control's is all zero
    data = json.loads(re.search(r"<div class='sl-lh'><script type='application/json'>(.*?)</script>", page).group(1))
    assert data["labels"] == ["planted", "planted (random init, seed 7)"]
    corpus_rate, control_rate = (np.array(x, float) for x in data["metrics"]["sink rate"]["runs"])
    np.testing.assert_allclose(corpus_rate, _planted_sink_rate(), atol=1e-4)
    assert not control_rate.any()
    md = rep.summary_md.read_text()
    assert "### Sink tokens" in md and "<table" not in md


@pytest.mark.slow
def test_all_zero_control_is_drawn_at_zero_and_colour_bars_fit(corpora, tmp_path):
    """fig05: the control's all-zero 'sinks per step' was drawn mid-scale with a 0.05–0.10 bar."""
    from sinklens.analysis.corpus import open_corpus

    run, ctrl = corpora
    views = [("planted", open_corpus(run).to_dict()["views"]["scaled_sum"]),
             ("control", open_corpus(ctrl).to_dict()["views"]["scaled_sum"])]
    fig = CF.layer_head(views)
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig).draw()
    images = [im for ax in fig.axes for im in ax.images]
    assert len(images) == 4                                          # rate and count, corpus and control
    control_count = images[3]
    assert not np.asarray(control_count.get_array()).any()
    assert control_count.norm.vmin == 0 and control_count.norm(0.0) == 0.0      # zero: the scale's lowest colour
    assert control_count.norm.vmax == images[1].norm.vmax > 0.1                 # one scale for corpus and control
    r = fig.canvas.get_renderer()
    page = fig.bbox
    for ax in fig.axes:
        for text in (ax.title, ax.xaxis.label, ax.yaxis.label):
            if text.get_text():
                box = text.get_window_extent(r)
                assert page.x0 <= box.x0 and box.x1 <= page.x1 + 0.5 and page.y0 <= box.y0 and box.y1 <= page.y1 + 0.5, \
                    text.get_text()
    fig.savefig(tmp_path / "fig05_corpus.png", dpi=110)


def test_report_reads_a_corpus_run_folder_and_a_folder_of_traces(corpora, tmp_path, capsys):
    from sinklens.cli import main
    from sinklens.trace import TraceWriter

    run, _ = corpora
    assert main(["report", str(run.parent), "--out", str(tmp_path / "r"), "--quiet", "--no-figures"]) == 0
    assert json.loads((tmp_path / "r" / "summary.json").read_text())["num_prompts"] == 3
    traces = tmp_path / "traces"
    traces.mkdir()
    rng = np.random.default_rng(0)
    for name in ("b", "a"):
        with TraceWriter(traces / f"{name}.arrow", {"family": "llada"}) as w:
            for t in range(2):
                w.write_step(t, tokens=rng.integers(0, 50, (1, 8)), is_masked=np.zeros((1, 8), bool),
                             received=rng.random((1, 1, 2, 8)).astype(np.float32) + np.eye(8)[0] * 6)
    assert main(["report", str(traces), "--out", str(tmp_path / "t"), "--quiet", "--no-figures"]) == 0
    assert [t["trace"] for t in json.loads((tmp_path / "t" / "summary.json").read_text())["traces"]] == ["a", "b"]
    (tmp_path / "empty").mkdir()
    assert main(["report", str(tmp_path / "empty"), "--out", str(tmp_path / "e"), "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "neither a corpus.jsonl" in err[0]


# ---- in a browser -------------------------------------------------------------------------------------
from test_report_html import _at_width, _errors, _screenshot, browser  # noqa: E402,F401  (the Chromium fixture)


@pytest.mark.slow
@pytest.mark.browser
@pytest.mark.parametrize("width", [1366, 1920])
def test_corpus_page_in_a_browser(browser, corpora, tmp_path, width):  # noqa: F811
    """Nothing runs off the screen; clicking a head in the grid selects it; the table lists the
    corpus' and the control's value there; the all-zero control grid is drawn at the lowest colour."""
    run, ctrl = corpora
    rep = build_corpus_report(run, tmp_path / "r", control=ctrl)
    _at_width(browser, width, 900)
    try:
        browser.get(rep.html.resolve().as_uri())
        o = browser.execute_script("return [document.documentElement.scrollWidth, document.documentElement.clientWidth]")
        assert o[0] <= o[1], o
        cut = browser.execute_script("""return Array.from(document.querySelectorAll('.sl-card')).filter(
            c => c.scrollWidth > c.clientWidth + 1).map(c => c.querySelector('h2').textContent)""")
        assert cut == []
        # click layer 1, head 2 of the corpus grid
        cv = browser.execute_script("return window.sinklensCorpus[0].canvases[0]")
        g = browser.execute_script("return window.sinklensCorpus[0].geom()")
        from selenium.webdriver.common.action_chains import ActionChains

        rect = browser.execute_script("const r = arguments[0].getBoundingClientRect(); return [r.width, r.height]", cv)
        w, h = int(cv.get_attribute("width")), int(cv.get_attribute("height"))
        x = (g["left"] + 2.5 * g["cw"]) * rect[0] / w - rect[0] / 2
        y = (g["top"] + 1.5 * g["ch"]) * rect[1] / h - rect[1] / 2
        ActionChains(browser).move_to_element_with_offset(cv, x, y).click().perform()
        assert browser.execute_script("return [window.sinklensCorpus[0].l, window.sinklensCorpus[0].h]") == [1, 2]
        row = browser.execute_script("""return Array.from(window.sinklensCorpus[0].table.querySelectorAll('tr'))
            .map(tr => Array.from(tr.children).map(c => c.textContent))""")
        assert row[0] == ["layer 1, head 2", "planted", "planted (random init, seed 7)"]
        rate = next(r for r in row if r[0] == "sink rate")
        assert abs(float(rate[1]) - _planted_sink_rate()[1, 2]) < 2e-3 and rate[2] == "0"
        drawn = browser.execute_script("return window.sinklensCorpus[0].drawn")
        assert set(drawn[1]) == {0}                                     # the control's zeros: the lowest colour
        _screenshot(browser, tmp_path / f"corpus-{width}.png")
        assert _errors(browser) == []
    finally:
        browser.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})
