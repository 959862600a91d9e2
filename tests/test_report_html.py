"""The interactive page in headless Chromium (Debian chromium + chromium-driver, Selenium)."""
from __future__ import annotations

import json
import os
import shutil
import tempfile

import pytest

import _planted as P
from sinklens.report.report import ReportOptions, build_report

QUICK = ReportOptions(figures=False, progress=False)   # the page only: figures are tested in test_report.py

CHROMIUM, DRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
pytestmark = pytest.mark.browser


def _have_browser() -> str | None:
    if not (os.path.exists(CHROMIUM) and os.path.exists(DRIVER)):
        return f"needs {CHROMIUM} and {DRIVER} (Debian packages chromium, chromium-driver; scripts/browser-deps.sh)"
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "needs selenium (pip install selenium)"
    return None


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    why = _have_browser()
    if why:
        pytest.skip(why)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for a in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
              "--disable-component-update", "--disable-sync", "--no-first-run", "--window-size=1400,1400",
              f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}"):
        opts.add_argument(a)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    drv = webdriver.Chrome(service=Service(DRIVER), options=opts)
    yield drv
    drv.quit()


def _screenshot(drv, path) -> None:
    """Save a screenshot (kept in $SINKLENS_SCREENSHOT_DIR when set, to look at)."""
    drv.save_screenshot(str(path))
    assert path.stat().st_size > 10_000
    keep = os.environ.get("SINKLENS_SCREENSHOT_DIR")
    if keep:
        shutil.copy(path, keep)


def _errors(drv) -> list[str]:
    return [e["message"] for e in drv.get_log("browser") if e["level"] in ("SEVERE", "ERROR")]


@pytest.mark.slow
def test_page_renders_slider_changes_step_no_console_errors(browser, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    rep = build_report([P.source(label="planted")], tmp_path / "report", options=QUICK)
    browser.get(rep.html.resolve().as_uri())
    viewer = browser.find_element(By.CSS_SELECTOR, ".sl-viewer")
    label = viewer.find_element(By.CSS_SELECTOR, ".sl-steplabel")
    assert label.text.startswith("step 0 ")
    toks = viewer.find_elements(By.CSS_SELECTOR, ".sl-tok")
    assert len(toks) == P.S
    # pick layer 0 / head 1 (planted moving sink 10 -> 20 at step 5)
    browser.execute_script("""const v = window.sinklensViewers[0];
        v.layerSel.value = 0; v.layerSel.dispatchEvent(new Event('change'));
        v.headSel.value = 1; v.headSel.dispatchEvent(new Event('change'));""")
    largest = lambda: [int(t.get_attribute("title").split()[1]) for t in viewer.find_elements(By.CSS_SELECTOR, ".sl-tok.largest")]
    assert largest() == [10]
    slider = viewer.find_element(By.CSS_SELECTOR, "input.sl-step")
    slider.click()                      # focus; the click may move it, so drive it with keys from a known step
    slider.send_keys(Keys.HOME)
    for _ in range(5):
        slider.send_keys(Keys.ARROW_RIGHT)
    assert label.text.startswith("step 5 ")
    assert largest() == [20]           # the page follows the move
    _screenshot(browser, tmp_path / "report-page.png")
    # stored map shown for (1, 0) at step 0
    browser.execute_script("""const v = window.sinklensViewers[0]; v.setStep(0, true);
        v.layerSel.value = 1; v.layerSel.dispatchEvent(new Event('change'));
        v.headSel.value = 0; v.headSel.dispatchEvent(new Event('change'));""")
    cv = viewer.find_element(By.CSS_SELECTOR, "canvas.sl-map")
    assert int(cv.get_attribute("width")) > P.S and cv.is_displayed()     # map + axes + colour bar
    assert _errors(browser) == []


def test_compare_page_links_steps(browser, tmp_path):
    from selenium.webdriver.common.by import By

    rep = build_report([P.source(label="a"), P.source(seed=1, with_maps=False, label="b")], tmp_path / "cmp",
                       options=QUICK)
    browser.get(rep.html.resolve().as_uri())
    viewers = browser.find_elements(By.CSS_SELECTOR, ".sl-viewer")
    assert [v.get_attribute("data-trace") for v in viewers] == ["a", "b"]
    browser.execute_script("window.sinklensViewers[0].setStep(7, true)")
    labels = [v.find_element(By.CSS_SELECTOR, ".sl-steplabel").text for v in viewers]
    assert all(l.startswith("step 7 ") for l in labels)
    note = viewers[1].find_element(By.CSS_SELECTOR, ".sl-mapnote").text
    browser.execute_script("window.sinklensViewers[0].toggle()")   # play runs without errors
    browser.execute_script("window.sinklensViewers[0].toggle()")
    assert _errors(browser) == []
    assert "no full attention maps" in note or "stores no full attention maps" in note


def test_page_survives_hostile_token_strings(browser, tmp_path):
    from selenium.webdriver.common.by import By

    from sinklens.analysis import ArraySource

    d = P.build(with_maps=False)
    vocab = {**P.VOCAB, 4: "</script><!--", 5: "<b>&amp;\"'"}
    src = ArraySource(d["received"], d["tokens"], is_masked=d["is_masked"], vocab=vocab, mask_id=P.MASK_ID,
                      label="hostile")
    rep = build_report([src], tmp_path / "hostile", options=QUICK)
    browser.get(rep.html.resolve().as_uri())
    texts = {t.get_attribute("textContent") for t in browser.find_elements(By.CSS_SELECTOR, ".sl-tok")}
    assert "</script><!--" in texts and "<b>&amp;\"'" in texts
    assert _errors(browser) == []


def _num(text: str) -> float:
    return float(text.replace("−", "-"))


def test_first_view_legend_summary_chart_and_map(browser, tmp_path):
    """What a first look needs: the strongest-sink head with a hint, numbers on the legend, a
    readable summary (3 significant digits), step ticks on the chart, a map with axes and a colour
    bar in the figures' colormap (matplotlib's magma, not a copy of it)."""
    import json
    import re

    import matplotlib
    import numpy as np
    from selenium.webdriver.common.by import By

    from sinklens.analysis import analyze

    src = P.source(label="planted")
    strongest = analyze(src).strongest_sink_head()
    rep = build_report([src], tmp_path / "first", options=QUICK)
    browser.get(rep.html.resolve().as_uri())
    v = browser.find_element(By.CSS_SELECTOR, ".sl-viewer")
    assert (int(v.find_element(By.CSS_SELECTOR, ".sl-layer").get_attribute("value")),
            int(v.find_element(By.CSS_SELECTOR, ".sl-head").get_attribute("value"))) == strongest
    hint = v.find_element(By.CSS_SELECTOR, ".sl-hint").text
    assert "strongest sink" in hint.lower() and f"layer {strongest[0]}, head {strongest[1]}" in hint
    nums = [_num(e.text) for e in v.find_elements(By.CSS_SELECTOR, ".sl-legend-num")]
    assert len(nums) == 5 and nums == sorted(nums) and nums[-1] > 0          # numbers, low to high
    rows = v.find_elements(By.CSS_SELECTOR, ".sl-summary table tr")
    assert len(rows) >= 10
    text = v.find_element(By.CSS_SELECTOR, ".sl-summary").text
    assert not re.search(r"\d\.\d{4,}", text) and "sinks_total" not in text and "\": " not in text   # no raw JSON, no 16-digit floats
    ticks = browser.execute_script("return window.sinklensViewers[0].chartTicks")
    assert ticks["x"][0] == 0 and len(ticks["x"]) >= 3 and ticks["y"][0] == 0
    browser.execute_script("""const v = window.sinklensViewers[0]; v.setStep(0, true);
        v.layerSel.value = 1; v.layerSel.dispatchEvent(new Event('change'));
        v.headSel.value = 0; v.headSel.dispatchEvent(new Event('change'));""")
    bar = browser.execute_script("return window.sinklensViewers[0].mapBar")
    assert len(bar) == 5 and bar == sorted(bar) and abs(bar[-1] - float(src.map(0, 1, 0).max())) < 1e-3 * bar[-1]
    cmap = json.loads(browser.execute_script("return document.getElementById('sl-cmap').textContent"))
    magma = np.round(matplotlib.colormaps["magma"](np.linspace(0, 1, 256))[:, :3] * 255)
    assert np.array_equal(np.array(cmap), magma)
    _screenshot(browser, tmp_path / "report-first-view.png")
    assert _errors(browser) == []


def test_compare_mode_one_column_per_trace_units_toggle(browser, tmp_path):
    """Three traces, one causal: three columns; the causal one toggles to uniform_ratio in place."""
    from selenium.webdriver.common.by import By

    rep = build_report([P.source(label="a"), P.arm_source("arm"), P.source(seed=1, with_maps=False, label="b")],
                       tmp_path / "cmp3", options=QUICK)
    browser.get(rep.html.resolve().as_uri())
    viewers = browser.find_elements(By.CSS_SELECTOR, ".sl-viewer")
    assert [v.get_attribute("data-trace") for v in viewers] == ["a", "arm", "b"]
    columns = browser.execute_script(
        "return getComputedStyle(document.getElementById('sl-viewers')).gridTemplateColumns.split(' ').length")
    assert columns == 3
    toggles = [v.find_elements(By.CSS_SELECTOR, "select.sl-units") for v in viewers]
    assert [len(t) for t in toggles] == [0, 1, 0]
    sel = toggles[1][0]
    assert [o.text for o in sel.find_elements(By.TAG_NAME, "option")] == ["scaled_sum", "uniform_ratio"]
    before = [e.text for e in viewers[1].find_elements(By.CSS_SELECTOR, ".sl-legend-num")]
    browser.execute_script("""const v = window.sinklensViewers[1]; v.unitsSel.value = 1;
        v.unitsSel.dispatchEvent(new Event('change'));""")
    assert viewers[1].get_attribute("data-units") == "uniform_ratio"
    assert [e.text for e in viewers[1].find_elements(By.CSS_SELECTOR, ".sl-legend-num")] != before
    assert "units=uniform_ratio" in viewers[1].find_element(By.CSS_SELECTOR, ".sl-summary summary").text
    _screenshot(browser, tmp_path / "compare.png")
    assert _errors(browser) == []


def test_two_inline_pages_in_one_document_work_independently(browser, tmp_path):
    """sinklens.show in a notebook: two fragments on one page, each with its own ids and viewers."""
    from selenium.webdriver.common.by import By

    from sinklens.report.show import page_view

    doc = tmp_path / "two.html"
    doc.write_text("<!DOCTYPE html><html><head><meta charset='utf-8'></head><body><p>cell 1</p>"
                   + page_view(P.source(label="first")).html + "<p>cell 2</p>"
                   + page_view([P.source(seed=1, label="second"), P.arm_source("arm")]).html + "</body></html>",
                   encoding="utf-8")
    browser.get(doc.resolve().as_uri())
    pages = browser.execute_script("return Object.keys(window.sinklensPages)")
    assert len(pages) == 2
    counts = browser.execute_script("return Object.values(window.sinklensPages).map(p => p.length)")
    assert counts == [1, 2]
    assert [v.get_attribute("data-trace") for v in browser.find_elements(By.CSS_SELECTOR, ".sl-viewer")] == \
        ["first", "second", "arm"]
    browser.execute_script("Object.values(window.sinklensPages)[1][0].setStep(4, true)")
    steps = browser.execute_script("return Object.values(window.sinklensPages).map(p => p.map(v => v.t))")
    assert steps[0] == [0] and steps[1][0] == 4            # the other page did not move
    assert _errors(browser) == []


def _at_width(drv, width: int, height: int) -> None:
    """The viewport a laptop (1366 × 768) or a wide screen (1600 px) gives the page."""
    drv.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                        {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False})


def _overflow(drv) -> dict:
    """What runs off the screen: page scroll width vs viewport, each viewer's box and inner width."""
    return drv.execute_script("""const W = document.documentElement.clientWidth;
        return {W: W, scroll: document.documentElement.scrollWidth,
                viewers: Array.from(document.querySelectorAll('.sl-viewer')).map(v => {
                    const r = v.getBoundingClientRect();
                    return {left: r.left, right: r.right, inner: v.scrollWidth, box: v.clientWidth}; })};""")


@pytest.mark.parametrize("width,height", [(1600, 1000), (1366, 768)])
def test_compare_page_shows_four_traces_whole(browser, tmp_path, width, height):
    """Four traces: every column lies inside the screen (a 5th would wrap to a new row), nothing
    inside a column is wider than it, and there is no sideways scrolling."""
    srcs = [P.source(label="a"), P.arm_source("arm"), P.source(seed=1, with_maps=False, label="b"),
            P.source(seed=2, label="c")]
    rep = build_report(srcs, tmp_path / "cmp4", options=QUICK)
    _at_width(browser, width, height)
    try:
        browser.get(rep.html.resolve().as_uri())
        o = _overflow(browser)
        assert len(o["viewers"]) == 4
        assert o["scroll"] <= o["W"], o
        for v in o["viewers"]:
            assert 0 <= v["left"] and v["right"] <= o["W"] + 0.5, o
            assert v["inner"] <= v["box"], o                      # no element cut inside a column
        _screenshot(browser, tmp_path / f"compare4-{width}.png")
        assert _errors(browser) == []
    finally:
        browser.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})


@pytest.mark.slow
def test_page_blocks_and_edits_on_real_traces(browser, tmp_path):
    """LLaDA2.1 (block-causal, editing), SDAR (block-causal, KV cache) and LLaDA (generation blocks)
    on one page: block boundaries in the chart and the token strip where the samplers put them,
    edited tokens marked as the trace flags them, the per-block table, a baseline units toggle for
    the block-causal traces only."""
    import numpy as np
    from selenium.webdriver.common.by import By

    import _block_traces as B
    import sinklens

    traces = B.make(tmp_path)
    rep = build_report([traces["llada21"], traces["sdar"], traces["llada"]], tmp_path / "blocks",
                       labels=["LLaDA2.1", "SDAR", "LLaDA"], options=QUICK)
    _at_width(browser, 1366, 768)
    try:
        browser.get(rep.html.resolve().as_uri())
        S = [browser.execute_script(f"return window.sinklensViewers[{k}].d.S") for k in range(3)]
        prompt = sinklens.open_trace(traces["llada"]).meta["layout"]["prompt_length"]
        want = [list(range(B.LLADA2_BLOCK, S[0], B.LLADA2_BLOCK)), list(range(B.SDAR_BLOCK, S[1], B.SDAR_BLOCK)),
                list(range(prompt + B.LLADA_BLOCK, S[2], B.LLADA_BLOCK))]
        assert browser.execute_script("return window.sinklensViewers.map(v => v.chartBlocks)") == \
               [want[0], want[1], [prompt] + want[2]]
        starts = browser.execute_script("""return window.sinklensViewers.map(v => { v.setStep(v.d.T - 1, false);
            return v.cells.map((c, j) => c.classList.contains('block-start') ? j : -1).filter(j => j >= 0); })""")
        assert starts == [want[0], want[1], [prompt] + want[2]]
        # edited tokens: every position the trace flags as rewritten at or before the last step
        t = sinklens.open_trace(traces["llada21"])
        ever = set()
        for s in t.steps:
            ever |= set(np.flatnonzero(t.edited(s)).tolist())
        marked = browser.execute_script("""const v = window.sinklensViewers[0];
            return v.cells.map((c, j) => c.classList.contains('edited') ? j : -1).filter(j => j >= 0)""")
        assert marked == sorted(ever) and marked
        assert browser.execute_script("return window.sinklensViewers[1].cells.some(c => c.classList.contains('edited'))") is False
        rows = browser.execute_script("""return window.sinklensViewers.map(v =>
            v.blocksBox.querySelectorAll('table tr').length)""")
        dyn = [json.loads(p.read_text()) for p in [rep.summary_json]][0]["traces"]
        assert rows == [len(tr["block_dynamics"]["blocks"]) + 1 for tr in dyn]     # header + one row per block
        assert [len(v.find_elements(By.CSS_SELECTOR, "select.sl-units"))
                for v in browser.find_elements(By.CSS_SELECTOR, ".sl-viewer")] == [1, 1, 0]
        o = _overflow(browser)
        assert o["scroll"] <= o["W"] and all(v["inner"] <= v["box"] for v in o["viewers"]), o
        _screenshot(browser, tmp_path / "blocks-1366.png")
        browser.execute_script("window.sinklensViewers[0].blocksBox.scrollIntoView()")
        _screenshot(browser, tmp_path / "blocks-table-1366.png")
        assert _errors(browser) == []
    finally:
        browser.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})


@pytest.mark.parametrize("n", [1, 2, 4])
def test_layer_and_head_pickers_share_a_row_at_1366(browser, tmp_path, n):
    """At 1366 px the head picker wrapped under the layer picker; pickers now wrap as pairs, on a
    row of their own."""
    srcs = [P.arm_source("arm"), P.source(label="a"), P.source(seed=1, with_maps=False, label="b"),
            P.source(seed=2, label="c")][:n]
    rep = build_report(srcs, tmp_path / f"pick{n}", options=QUICK)
    _at_width(browser, 1366, 768)
    try:
        browser.get(rep.html.resolve().as_uri())
        tops = browser.execute_script("""return window.sinklensViewers.map(v =>
            [v.layerSel.getBoundingClientRect().top, v.headSel.getBoundingClientRect().top])""")
        assert len(tops) == n and all(abs(layer - head) < 2 for layer, head in tops), tops
        _screenshot(browser, tmp_path / f"pickers-{n}-1366.png")
        assert _errors(browser) == []
    finally:
        browser.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})


def test_legend_says_when_both_units_views_share_the_scale(browser, tmp_path):
    """An ARM whose largest score is at a one-row decoding step: uniform_ratio equals the summed
    units there, so the legend's numbers stay — and the legend says why."""
    import numpy as np

    from sinklens.analysis import ArraySource

    rng = np.random.default_rng(0)
    prompt, decode = 12, 6
    S = prompt + decode
    received = np.zeros((decode + 1, 1, 2, S), np.float32)
    tokens = np.full((decode + 1, S), -1)
    qpos = []
    for t in range(decode + 1):
        n = prompt + t
        rows = rng.dirichlet(np.full(n, 0.3), size=n if t == 0 else 1)
        if t == 3:
            rows[:] = 0.01 / (n - 1)
            rows[:, 0] = 0.99                                     # one row, nearly all on key 0: the largest score
        received[t, 0, :, :n] = rows.sum(0)
        tokens[t, :n] = np.arange(n) % 5
        qpos.append(np.arange(n) if t == 0 else np.array([n - 1]))
    key_mask = tokens >= 0
    src = ArraySource(received, np.where(key_mask, tokens, 0), key_mask=key_mask, query_positions=qpos, causal=True,
                      vocab={i: f"t{i}" for i in range(5)}, prompt_length=prompt, label="arm")
    rep = build_report([src], tmp_path / "legend", options=QUICK)
    browser.get(rep.html.resolve().as_uri())
    nums = lambda: browser.execute_script(                       # noqa: E731
        "return Array.from(document.querySelectorAll('.sl-legend-num')).map(e => e.textContent)")
    before = nums()
    browser.execute_script("""const v = window.sinklensViewers[0]; v.unitsSel.value = 1;
        v.unitsSel.dispatchEvent(new Event('change'));""")
    assert nums() == before                                      # right: the two views' scales are the same
    legend = browser.execute_script("return document.querySelector('.sl-legend').textContent")
    assert "same scale in every units view" in legend and "units=uniform_ratio" in legend
    assert _errors(browser) == []
