"""`sinklens report` end to end on real trace files (written with the project's TraceWriter)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import _planted as P
from sinklens.analysis import AnalysisInputError, analyze
from sinklens.cli import main
from sinklens.report import figures as F
from sinklens.trace import TraceWriter

PRIMARY = ["fig01_received_layer1_mean", "fig03_score_distribution", "fig04_attention_maps", "fig05_layer_head",
           "fig07_sink_positions", "fig10_eps_sweep", "fig11_block_sinks"]   # the planted run has blocks


def write_planted(path, with_maps=True, dtype="float16", seed=0):
    d = P.build(seed, with_maps)
    meta = {"family": "llada", "mask_id": P.MASK_ID, "query_groups": ["masked", "unmasked"],
            "sampler": {"name": "llada", "args": {"gen_length": P.S - P.PROMPT, "block_length": P.BLOCK}},
            "causal": False, "prompt_length": P.PROMPT, "block_length": P.BLOCK,  # as every sampler writes them
            "tokens_vocab": {str(k): v for k, v in P.VOCAB.items()}}
    with TraceWriter(path, meta, received_dtype=dtype) as w:
        for t in range(P.T):
            maps = {(l, h): m[None] for (tt, l, h), m in d["maps"].items() if tt == t}
            w.write_step(t, d["tokens"][t], is_masked=d["is_masked"][t], received=d["received"][t],
                         received_groups=d["received_groups"][t], maps=maps or None)
    return path


def test_trace_file_gives_the_planted_result(tmp_path):
    path = write_planted(tmp_path / "planted.arrow")          # float16 storage, as samplers write by default
    a = analyze(path)
    b = analyze(P.source())
    assert a.source.block_length == P.BLOCK and a.source.prompt_length == P.PROMPT and not a.source.causal
    assert [(t.layer, t.head, t.steps, t.positions, t.kind) for t in a.tracks] == \
           [(t.layer, t.head, t.steps, t.positions, t.kind) for t in b.tracks]
    assert len(a.splits) == len(b.splits) == 5
    assert a.source.map_slices() == [(0, 1, 0), (3, 1, 0), (11, 1, 0)]
    np.testing.assert_allclose(a.source.map(3, 1, 0), P.build()["maps"][(3, 1, 0)], rtol=1e-6)
    assert a.token_table.categories["mask"]["count"] == b.token_table.categories["mask"]["count"]


@pytest.mark.slow
def test_cli_report_single_and_compare(tmp_path, capsys):
    p1 = write_planted(tmp_path / "dlm.arrow")
    p2 = write_planted(tmp_path / "nomaps.arrow", with_maps=False, seed=1)
    out = tmp_path / "rep"
    assert main(["report", str(p1), "--out", str(out), "--quiet"]) == 0
    for name in PRIMARY:
        for ext in ("png", "svg"):
            assert (out / f"{name}.{ext}").stat().st_size > 1000, name
        svg = (out / f"{name}.svg").read_text()
        assert "units=" in svg or "A[i, j]" in svg, f"{name} does not state its units"
    assert (out / "table2_sink_tokens.csv").read_text().startswith("token,token_id,category")
    s = json.loads((out / "summary.json").read_text())
    tr = s["traces"][0]
    assert tr["units"] == "scaled_sum" and tr["layer_head"]["units"] == "scaled_sum" and tr["eps_sweep"]["units"] == "scaled_sum"
    assert tr["track_kinds"] == {"static": 3, "moving": 3, "vanishing": 2, "transient": 0}
    assert "units" in (out / "summary.md").read_text()
    html = (out / "index.html").read_text()
    assert "http://" not in html and "https://" not in html        # no network: nothing fetched
    # figures embedded (+ the head's Fig. 1), and the mechanism-readout figures a trace without readouts
    # still has data for (from received attention alone: k·σ, absorption, mask-query ranking)
    readout_figs = ["readout_k_sigma", "readout_absorption", "readout_mask_ranking"]
    assert all((out / f"{n}.png").exists() for n in readout_figs)
    assert not (out / "readout_value_norms.png").exists()             # no value_norm column: skipped
    assert html.count("data:image/png;base64,") == len(PRIMARY) + 1 + len(readout_figs)
    # compare: two traces side by side, one without maps -> its map figure is skipped with the reason
    out2 = tmp_path / "cmp"
    assert main(["report", str(p1), str(p2), "--out", str(out2), "--quiet"]) == 0
    assert (out2 / "compare_fig10_eps_sweep.png").exists() and (out2 / "dlm" / "fig04_attention_maps.png").exists()
    assert not (out2 / "nomaps" / "fig04_attention_maps.png").exists()
    said = capsys.readouterr().out
    assert "holds no full attention maps" in said                 # how to get them, from the CLI and Python
    assert "sinklens trace --map-slices LAYER:HEAD" in said and "CaptureOptions(map_slices=" in said
    s2 = json.loads((out2 / "summary.json").read_text())
    assert [t["trace"] for t in s2["traces"]] == ["dlm", "nomaps"]


@pytest.mark.slow
def test_report_json_is_one_line_of_paths_and_headline_numbers(tmp_path, capsys):
    p = write_planted(tmp_path / "dlm.arrow")
    assert main(["report", str(p), "--out", str(tmp_path / "r"), "--json", "-q"]) == 0
    out = capsys.readouterr().out
    assert len(out.strip().splitlines()) == 1
    doc = json.loads(out)
    assert Path(doc["html"]).is_file() and Path(doc["summary_json"]).is_file()
    (t,) = doc["traces"]
    assert t["label"] == "dlm" and t["sinks_total"] > 0 and t["track_kinds"]["static"] == 3
    assert all(Path(f).is_file() for files in t["figures"].values() for f in files)


@pytest.mark.slow
def test_bad_inputs(tmp_path, capsys):
    p = write_planted(tmp_path / "nomaps.arrow", with_maps=False)
    a = analyze(p)
    with pytest.raises(AnalysisInputError, match="holds no full attention maps"):
        F.attention_maps(a, [0], 1, 0)
    with pytest.raises(AnalysisInputError, match="head 9 out of range"):
        F.sink_positions(a, [(0, 9)])
    with pytest.raises(AnalysisInputError, match="layer 5 out of range"):
        F.received_over_steps(a, 5, 0)
    with pytest.raises(AnalysisInputError, match="layer must be an int .0-based., got '1'"):
        F.received_over_steps(a, "1", 0)
    with pytest.raises(AnalysisInputError, match="head must be an int .0-based., got 1.5"):
        F.received_over_steps(a, 1, 1.5)
    with pytest.raises(AnalysisInputError, match=r"heads must be \(layer, head\) pairs"):
        F.sink_positions(a, [1, 2])
    with pytest.raises(AnalysisInputError, match="step index 40 out of range"):
        F.attention_maps(analyze(write_planted(tmp_path / "m.arrow")), [40], 1, 0)
    with pytest.raises(AnalysisInputError, match=r"no map for step index 1"):
        F.attention_maps(analyze(tmp_path / "m.arrow"), [1], 1, 0)
    no_capture = tmp_path / "no_capture.arrow"
    with TraceWriter(no_capture, {"family": "llada", "num_layers": 2, "num_heads": 3}) as w:
        w.write_step(0, np.arange(5))
    with pytest.raises(AnalysisInputError, match="holds no received attention"):
        analyze(no_capture)
    empty = tmp_path / "empty.arrow"
    TraceWriter(empty, {"family": "llada"}).close()
    with pytest.raises(AnalysisInputError, match="is empty"):
        analyze(empty)
    for eps in (0, -1, float("nan"), "3"):            # the command line refuses these; the API too
        with pytest.raises(ValueError, match="sink_eps must be a number > 0"):
            analyze(p, sink_eps=eps)
    from sinklens.report.report import build_report

    one = build_report(str(p), tmp_path / "one")      # one path, not its characters
    assert [r.label for r in one.traces] == ["nomaps"]
    with pytest.raises(SystemExit):
        main(["report", str(p), "--out", str(tmp_path / "x"), "--heads", "0-1"])
    assert main(["report", str(p), "--out", str(tmp_path / "x"), "--heads", "0:7", "--quiet"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == \
        "sinklens report: error: head 7 out of range: trace 'nomaps' has 3 heads (0..2)"


def test_truncated_trace_is_analysed_and_flagged(tmp_path):
    d = P.build(with_maps=False)
    path = tmp_path / "cut.arrow"
    w = TraceWriter(path, {"family": "llada"})
    for t in range(5):
        w.write_step(t, d["tokens"][t], is_masked=d["is_masked"][t], received=d["received"][t])
    w.abandon()                                                     # interrupted: no end-of-stream marker
    a = analyze(path)
    assert a.num_steps == 5 and any("truncated" in n for n in a.notes())


def test_batch_rows_are_separate(tmp_path):
    """Row 1 holds row 0 mirrored (position j -> S-1-j): its sinks come out mirrored."""
    d = P.build(with_maps=False)
    path = tmp_path / "two_rows.arrow"
    with TraceWriter(path, {"family": "llada"}) as w:
        for t in range(P.T):
            tok = np.stack([d["tokens"][t], d["tokens"][t][::-1]])
            rec = np.stack([d["received"][t], d["received"][t][..., ::-1]])
            w.write_step(t, tok, received=rec)
    a0, a1 = analyze(path, row=0), analyze(path, row=1)
    has = a0.largest_pos >= 0
    assert has.any() and (a1.largest_pos[has] == P.S - 1 - a0.largest_pos[has]).all()
    assert ((a1.largest_pos >= 0) == has).all()
    with pytest.raises(AnalysisInputError, match="row 2 out of range"):
        analyze(path, row=2)


def test_causal_trace_reports_raw_sums_and_uniform_ratio(tmp_path):
    from sinklens.report.report import ReportOptions, build_report

    rep = build_report([P.source(causal=True, label="arm")], tmp_path / "r",
                       options=ReportOptions(figures=False, progress=False))
    assert [a.units for a in rep.traces[0].analyses] == ["scaled_sum", "uniform_ratio"]
    html = rep.html.read_text()
    assert html.count('id="sl-head-') == 2                         # one panel per view
    s = json.loads(rep.summary_json.read_text())["traces"][0]
    assert s["causal"] and s["also"][0]["units"] == "uniform_ratio"
    assert any("H_S − H_j" in n for n in s["notes"])


@pytest.mark.slow
def test_labels_are_display_names_never_paths(tmp_path):
    """`--labels '../../X,a/b'`: nothing is written outside --out, no nested folders; each trace gets
    one safe, unique folder, and the labels are shown as given."""
    p1 = write_planted(tmp_path / "one.arrow", with_maps=False)
    p2 = write_planted(tmp_path / "two.arrow", with_maps=False, seed=1)
    p3 = write_planted(tmp_path / "three.arrow", with_maps=False, seed=2)
    out = tmp_path / "deep" / "rep"
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    assert main(["report", str(p1), str(p2), str(p3), "--out", str(out), "--labels", "../../X,a/b,..",
                 "--quiet"]) == 0
    written = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    outside = [p for p in written if p not in before and not (tmp_path / p).is_relative_to(out)
               and p != out.relative_to(tmp_path).parent and p != out.relative_to(tmp_path)]
    assert outside == []
    folders = sorted(p.name for p in out.iterdir() if p.is_dir())
    assert len(folders) == 3 and all("/" not in f and f not in (".", "..") for f in folders), folders
    assert folders == sorted(["_.._X", "a_b", "trace2"])      # as docs/analysis.md says
    assert not [p for p in out.rglob("*") if p.is_dir() and p.parent != out]      # no nested folders
    s = json.loads((out / "summary.json").read_text())
    assert [t["trace"] for t in s["traces"]] == ["../../X", "a/b", ".."]


@pytest.mark.slow
def test_no_maps_message_names_the_cli_flag_everywhere(tmp_path):
    """A trace without maps: the report, the analysis' own error and `map()` all tell a user of
    the command line which flag to set (`--map-slices`), not a Python field name alone."""
    from sinklens.analysis import as_source
    from sinklens.report.report import build_report

    p = write_planted(tmp_path / "nomaps.arrow", with_maps=False)
    src = as_source(p)
    with pytest.raises(KeyError) as e:
        src.map(0, 0, 0)
    skipped = build_report([p], tmp_path / "r").traces[0].skipped
    for said in (src.no_maps_message(), str(e.value), skipped["fig04_attention_maps"],
                 (tmp_path / "r" / "summary.md").read_text()):
        assert "sinklens trace --map-slices LAYER:HEAD" in said and "CaptureOptions map_slices" not in said


def test_a_report_that_cannot_read_its_trace_makes_no_folder(tmp_path, capsys):
    """A garbage or empty trace is refused in one line, and `--out` is not created for nothing."""
    garbage = tmp_path / "garbage.arrow"
    garbage.write_bytes(b"this is not an arrow stream")
    empty = tmp_path / "empty.arrow"
    TraceWriter(empty, {"family": "llada"}).close()
    for bad in (garbage, empty):
        out = tmp_path / f"out_{bad.stem}"
        assert main(["report", str(bad), "--out", str(out), "--quiet"]) == 2
        assert "Traceback" not in capsys.readouterr().err
        assert not out.exists()


@pytest.mark.slow
def test_report_never_overwrites_files_it_did_not_write(tmp_path, capsys):
    """--out in a folder holding the user's own index.html / summary.md is refused before any work;
    a report re-run into its own folder replaces its files."""
    p = write_planted(tmp_path / "run.arrow", with_maps=False)
    mine = tmp_path / "project"
    mine.mkdir()
    (mine / "index.html").write_text("<html>my page</html>")
    (mine / "notes.txt").write_text("mine")
    assert main(["report", str(p), "--out", str(mine), "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "holds index.html that no sinklens report wrote" in err[0], err
    assert (mine / "index.html").read_text() == "<html>my page</html>"
    assert sorted(x.name for x in mine.iterdir()) == ["index.html", "notes.txt"]      # nothing written beside them
    (mine / "summary.json").write_text('{"mine": 1}')                                 # not a report's summary either
    assert main(["report", str(p), "--out", str(mine), "--quiet"]) == 2
    assert "index.html, summary.json" in capsys.readouterr().err
    out = tmp_path / "rep"
    assert main(["report", str(p), "--out", str(out), "--quiet"]) == 0
    (out / "notes.txt").write_text("mine")
    assert main(["report", str(p), "--out", str(out), "--quiet"]) == 0                # its own folder: replaced
    assert (out / "notes.txt").read_text() == "mine" and "sinklens_report" in (out / "summary.json").read_text()


def test_a_page_over_its_cap_is_said(tmp_path, capsys):
    """--html-max-mb thins per-head data only: a page that still exceeds it gets a note (it was silent)."""
    p = write_planted(tmp_path / "run.arrow", with_maps=False)
    assert main(["report", str(p), "--out", str(tmp_path / "r"), "--html-max-mb", "0.01", "--no-figures"]) == 0
    size = (tmp_path / "r" / "index.html").stat().st_size / 1e6
    assert size > 0.01
    assert f"note: index.html is {size:.1f} MB, over --html-max-mb 0.01" in capsys.readouterr().out
    assert main(["report", str(p), "--out", str(tmp_path / "r"), "--no-figures"]) == 0     # under the default cap
    assert "over --html-max-mb" not in capsys.readouterr().out
