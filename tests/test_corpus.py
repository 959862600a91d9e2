"""Corpus runs (`sinklens trace --prompts`): totals equal to what the analysis finds in each
prompt's full trace, any accumulator streamed, bad lines skipped with file:line, resume after a
kill with nothing lost or counted twice, 2 processes giving the same file as 1, and the report.
"""
from __future__ import annotations

import importlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from sinklens.analysis.accumulate import Accumulator, Step
from sinklens.analysis.analyze import AnalysisConfig, analyze
from sinklens.analysis.corpus import open_corpus
from sinklens.cli import main
from sinklens.eval.corpus import CorpusConfig, run_corpus

A = importlib.import_module("sinklens.analysis.analyze")   # the module (the package exports the function)
REPO = Path(__file__).resolve().parents[1]
DLM_FAST = {"steps": 2, "gen_length": 4, "block_length": 4}


def write_prompts(path: Path, n: int, extra_lines: tuple[str, ...] = ()) -> Path:
    with open(path, "w") as f:
        for i in range(n):
            f.write(json.dumps({"id": f"p{i}", "prompt": f"Tom has {i} apples and gets {i % 7 + 1} more."}) + "\n")
        for line in extra_lines:
            f.write(line + "\n")
    return path


@pytest.fixture(scope="module")
def dlm():
    from sinklens.models.loader import load

    return load("tiny-dlm")


class MaxScore(Accumulator):
    """A made-up analysis beside the built-in ones: the highest real-key score per step."""

    name = "max_score"

    def __init__(self, source, config):
        self.values = np.zeros(source.num_steps)

    def add(self, step: Step) -> None:
        self.values[step.index] = step.scores[..., step.data.key_mask].max()

    def result(self) -> dict:
        return {self.name: self.values}


def test_totals_equal_the_analyses_of_the_full_traces(dlm, tmp_path, monkeypatch):
    """Every prompt's trace kept: the corpus totals are what `analyze` finds on those traces,
    added up, and an accumulator the corpus code never heard of is streamed too."""
    monkeypatch.setattr(A, "ACCUMULATORS", A.ACCUMULATORS + [MaxScore])
    prompts = write_prompts(tmp_path / "p.jsonl", 5)
    path = run_corpus(CorpusConfig(model="tiny-dlm", prompts=str(prompts), out=str(tmp_path / "run"), keep_traces=5,
                                   sampler_args=DLM_FAST), model=dlm)
    c = open_corpus(path)
    assert [r["index"] for r in c.records] == list(range(5)) and all(r["trace"] for r in c.records)
    analyses = [analyze(tmp_path / "run" / r["trace"], AnalysisConfig()) for r in c.records]
    steps = sum(a.num_steps for a in analyses)
    lh = c.layer_head()
    np.testing.assert_allclose(lh["sink_rate"], sum((a.largest_pos >= 0).sum(0) for a in analyses) / steps)
    np.testing.assert_allclose(lh["sinks_per_step"], sum(a.sink_count.sum(0) for a in analyses) / steps)
    view = c.to_dict()["views"]["scaled_sum"]
    flagged = sum(a.eps_sweep.fraction * a.eps_sweep.n_tokens for a in analyses)
    keys = sum(a.eps_sweep.n_tokens for a in analyses)
    np.testing.assert_allclose(view["eps_sweep"]["fraction_flagged"], flagged / keys, atol=1e-6)
    assert view["sinks_total"] == sum(int(a.sink_count.sum()) for a in analyses) > 0
    for cat, v in view["sink_tokens"]["categories"].items():
        assert v["count"] == sum(a.token_table.categories[cat]["count"] for a in analyses)
    assert view["dynamics"]["track_kinds"]["static"] == sum(tr.kind == "static" for a in analyses for tr in a.tracks)
    assert view["score_distribution"]["counts"] == sum(a.hist.sum(0) for a in analyses).tolist()
    expected_max = np.mean(np.concatenate([a.extra["max_score"] for a in analyses]))
    assert view["other"]["max_score"]["mean"] == pytest.approx(expected_max, abs=1e-4)


ALL_READOUTS = dict(value_norms=True, qk_norms=True, diagonal=True, distance=True, hidden_norms=True)
READOUT_FLAGS = ["--value-norms", "--qk-norms", "--diagonal", "--distance", "--hidden-norms"]
READOUT_SECTIONS = ("k_sigma", "absorption", "mask_query_ranking", "sink_vectors", "massive_activations",
                    "diagonal_heads", "distance_profile")
READOUT_FIGURES = ("readout_value_norms", "readout_massive", "readout_diagonal_heads", "readout_distance")


def _pooled(arrays, axis=0):
    """nanmean over every (prompt, step): the prompts' (T, ...) arrays stacked along the steps."""
    from sinklens.analysis.readouts import nanmean

    return nanmean(np.concatenate(arrays, axis=0), axis=axis)


@pytest.mark.slow
def test_readout_totals_equal_the_kept_traces_pooled(dlm, tmp_path):
    """Every readout on, prompts of different lengths, every trace kept: each readout's corpus mean is
    the mean over the kept traces' steps pooled (never a mean of per-prompt means), the distance
    profile is Σ attention / Σ steps over prompts of different lengths, and the report has a section
    and, where the trace report has one, a figure for each."""
    from sinklens.report.corpus import build_corpus_report
    from sinklens.samplers.capture import CaptureOptions

    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": "apples " * (1 + 3 * i)}) + "\n" for i in range(4)))
    capture = CaptureOptions(**ALL_READOUTS, lens_layers=[0, 3])
    path = run_corpus(CorpusConfig(model="tiny-dlm", prompts=str(prompts), out=str(tmp_path / "run"), keep_traces=4,
                                   sampler_args={**DLM_FAST, "steps": 3}, capture=capture), model=dlm)
    c = open_corpus(path)
    a = [analyze(tmp_path / "run" / r["trace"], AnalysisConfig()) for r in c.records]
    t = c.totals["scaled_sum"]
    mean = lambda x: x["sum"] / x["n"]   # noqa: E731
    np.testing.assert_allclose(mean(t["diagonal_heads"]["diagonal"]), _pooled([x.diagonal_heads.diagonal for x in a]))
    np.testing.assert_allclose(mean(t["massive_activations"]["sink_norm_ratio"]),
                               _pooled([x.massive_activations.sink_norm_ratio for x in a]))
    sv = t["sink_vectors"]
    for col in ("value_norm", "key_norm"):
        np.testing.assert_allclose(sv[f"{col}_ratio"]["sum"].sum(-1) / sv[f"{col}_ratio"]["n"].sum(-1),
                                   _pooled([x.sink_vectors.ratio(col) for x in a], axis=(0, 2)))
    np.testing.assert_allclose(sv["qk_cos_sink"]["sum"], sum(np.nansum(x.sink_vectors.sink["qk_cos"], 0) for x in a))
    by = sv["value_norm_by_score"]
    np.testing.assert_allclose(by["count"], sum(x.sink_vectors.bin_count for x in a))
    np.testing.assert_allclose(by["sum"], sum(x.sink_vectors.bin_sum for x in a))
    # the distance profile: prompts of different lengths, so the sums are zero-padded before they add
    lengths = {x.distance_profile.total.shape[1] for x in a}
    assert len(lengths) == 4
    D = max(lengths)
    pad = lambda m: np.pad(m, [(0, 0)] * (m.ndim - 1) + [(0, D - m.shape[-1])])   # noqa: E731
    steps = sum(x.distance_profile.steps for x in a)
    dp = t["distance_profile"]
    assert dp["steps"] == steps == sum(x.num_steps for x in a)
    np.testing.assert_allclose(dp["attention"] / dp["steps"], sum(pad(x.distance_profile.total) for x in a) / steps)
    np.testing.assert_allclose(dp["uniform"], sum(pad(x.distance_profile.uniform) for x in a))
    assert {k: v["prompts"] for k, v in c.to_dict()["views"]["scaled_sum"]["per_trace_only"].items()} == {
        "absorption": 4, "massive_activations": 4, "logit_lens": 4}
    rep = build_corpus_report(path, tmp_path / "report")
    md = rep.summary_md.read_text()
    for name in READOUT_SECTIONS:
        assert f"### {name} (summed over prompts)" in md, name
    for name in READOUT_FIGURES:
        assert (tmp_path / "report" / f"{name}.png").stat().st_size > 1000, name
        assert f"alt='{name}'" in rep.html.read_text()
    assert "| logit_lens | 4 |" in md and "`traces/000003.arrow`" in md
    # the table's per-layer mean is the pooled mean too
    row = next(line for line in md.splitlines() if line.startswith("| diagonal |"))
    per_layer = [float(v) for v in row.split("|")[4].split(",")]
    np.testing.assert_allclose(per_layer, _pooled([x.diagonal_heads.diagonal for x in a], axis=(0, 2)), rtol=1e-3)


def test_bad_lines_and_long_prompts_are_skipped_with_file_and_line(tmp_path, capsys):
    prompts = write_prompts(tmp_path / "p.jsonl", 3, ("{not json", json.dumps({"prompt": 3}),
                                                      json.dumps({"id": "p0", "prompt": "again"}),
                                                      json.dumps({"prompt": "x " * 400}),
                                                      json.dumps({"prompt": "  "})))
    rc = main(["trace", "--model", "tiny-dlm", "--prompts", str(prompts), "--out", str(tmp_path / "run"),
               "--steps", "2", "--gen-length", "4", "--block-length", "4", "-q"])
    assert rc == 0
    err = capsys.readouterr().err
    for line in (4, 5, 6, 7, 8):
        assert f"p.jsonl:{line}:" in err
    c = open_corpus(tmp_path / "run" / "corpus.jsonl")
    assert c.num_prompts == 3 and len(c.meta["skipped"]) == 5
    assert any(s.endswith("p.jsonl:8: the prompt is empty") for s in c.meta["skipped"])
    assert "exceeds the context" in c.meta["skipped"][-1] and "duplicate id 'p0'" in c.meta["skipped"][-2]


@pytest.mark.parametrize("argv, expected", [
    (["--prompts", "missing.jsonl"], "--prompts 'missing.jsonl': no such file"),
    (["--prompt", "hi", "--keep-traces", "2"], "--keep-traces goes with --prompts"),
])
def test_bad_flags_are_one_line(argv, expected, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["trace", "--model", "tiny-dlm", *argv, "--out", "run"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and expected in err[0]


def _env(**extra) -> dict:
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", "OMP_NUM_THREADS": "1",
           "CUDA_VISIBLE_DEVICES": "", **extra}
    env.pop("WORLD_SIZE", None), env.pop("RANK", None)
    return env


def _trace_args(prompts: Path, out: Path, *flags: str) -> list[str]:
    return ["-m", "sinklens.cli", "trace", "--model", "tiny-dlm", "--prompts", str(prompts), "--out", str(out),
            "--steps", "2", "--gen-length", "4", "--block-length", "4", "-q", *flags]


@pytest.mark.slow
def test_two_processes_write_the_same_file_as_one(tmp_path):
    """With every readout on: their parts (the distance profile's padded sums too) merge the same."""
    prompts = write_prompts(tmp_path / "p.jsonl", 6)
    flags = (*READOUT_FLAGS, "--lens-layers", "0,3")
    one = subprocess.run([sys.executable, *_trace_args(prompts, tmp_path / "one", *flags)], env=_env(),
                         capture_output=True, text=True, timeout=300)
    assert one.returncode == 0, one.stderr[-3000:]
    two = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                          *_trace_args(prompts, tmp_path / "two", *flags)], env=_env(), capture_output=True, text=True,
                         timeout=300)
    assert two.returncode == 0, two.stderr[-3000:]
    for r in (0, 1):     # each rank did its own share
        lines = [json.loads(x) for x in open(tmp_path / "two" / f"samples.rank{r}.jsonl")]
        assert [x["index"] for x in lines] == [r, r + 2, r + 4]
    assert (tmp_path / "two" / "corpus.jsonl").read_bytes() == (tmp_path / "one" / "corpus.jsonl").read_bytes()
    assert set(READOUT_SECTIONS) <= set(open_corpus(tmp_path / "one" / "corpus.jsonl").totals["scaled_sum"])


@pytest.mark.slow
def test_resume_after_kill_loses_nothing_and_counts_nothing_twice(tmp_path):
    prompts = write_prompts(tmp_path / "p.jsonl", 8)
    clean = subprocess.run([sys.executable, *_trace_args(prompts, tmp_path / "clean")], env=_env(),
                           capture_output=True, text=True, timeout=300)
    assert clean.returncode == 0, clean.stderr[-3000:]
    shard = tmp_path / "killed" / "samples.rank0.jsonl"
    proc = subprocess.Popen([sys.executable, *_trace_args(prompts, tmp_path / "killed")], env=_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 240
    while time.time() < deadline and (not shard.exists() or len(shard.read_bytes().splitlines()) < 3):
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done = shard.read_bytes().splitlines()
    assert 3 <= len(done) < 8, "the run was not interrupted midway"
    with open(shard, "ab") as f:           # a line torn by the kill
        f.write(b'{"id": "p7", "index": 7, "par')
    assert not (tmp_path / "killed" / "corpus.jsonl").exists()
    again = subprocess.run([sys.executable, *_trace_args(prompts, tmp_path / "killed")], env=_env(),
                           capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert (tmp_path / "killed" / "corpus.jsonl").read_bytes() == (tmp_path / "clean" / "corpus.jsonl").read_bytes()


def test_a_resumed_run_with_other_settings_is_refused(dlm, tmp_path):
    prompts = write_prompts(tmp_path / "p.jsonl", 2)
    cfg = dict(model="tiny-dlm", prompts=str(prompts), out=str(tmp_path / "run"))
    run_corpus(CorpusConfig(**cfg, sampler_args=DLM_FAST), model=dlm)
    with pytest.raises(ValueError, match="differs in \\['settings'\\]"):
        run_corpus(CorpusConfig(**cfg, sampler_args={**DLM_FAST, "steps": 4}), model=dlm)


def _report(corpus: Path, out: Path) -> dict:
    from sinklens.report.corpus import build_corpus_report

    rep = build_corpus_report(corpus, out)
    assert rep.html.stat().st_size > 10_000 and "data:image/png;base64" in rep.html.read_text()
    for name in ("fig05_layer_head", "fig03_score_distribution", "fig10_eps_sweep"):
        assert (out / f"{name}.png").stat().st_size > 1000
    return json.loads(rep.summary_json.read_text())


def _shows_every_readout(out: Path, d: dict, views: tuple[str, ...], prompts: int) -> None:
    """The report of a run with every readout on: a section and (where the trace report has one) a
    figure per readout and units view, and the lens listed as per trace only, for every prompt."""
    md = (out / "summary.md").read_text()
    page = (out / "index.html").read_text()
    sections = [n for n in READOUT_SECTIONS if not (d["causal"] and n == "mask_query_ranking")]  # no masked rows
    for k, units in enumerate(views):
        suffix = "" if k == 0 else f"_{units}"
        block = md.split(f"## units {units}")[1].split("## units ")[0]
        for name in sections:
            assert f"### {name} (summed over prompts)" in block, (units, name)
        for name in READOUT_FIGURES:
            assert (out / f"{name}{suffix}.png").stat().st_size > 1000 and f"alt='{name}{suffix}'" in page
        assert d["views"][units]["per_trace_only"]["logit_lens"]["prompts"] == prompts
        assert d["views"][units]["other"]["distance_profile"]["steps"] == d["views"][units]["steps"]


@pytest.mark.slow
def test_200_twin_prompts_report(dlm, tmp_path):
    from sinklens.samplers.capture import CaptureOptions

    prompts = write_prompts(tmp_path / "p.jsonl", 200)
    path = run_corpus(CorpusConfig(model="tiny-dlm", prompts=str(prompts), out=str(tmp_path / "run"), keep_traces=3,
                                   sampler_args={"steps": 1, "gen_length": 2, "block_length": 2},
                                   capture=CaptureOptions(**ALL_READOUTS, lens_layers=[3])), model=dlm)
    assert sorted(p.name for p in (tmp_path / "run" / "traces").iterdir()) == [
        "000000.arrow", "000100.arrow", "000199.arrow"]              # the kept sample, nothing else
    d = _report(Path(path), tmp_path / "report")
    v = d["views"]["scaled_sum"]
    assert d["num_prompts"] == 200 and v["steps"] == 200
    assert 0 < v["fraction_heads_steps_with_sink"] <= 1
    assert sum(c["count"] for c in v["sink_tokens"]["categories"].values()) == v["sinks_total"]
    _shows_every_readout(tmp_path / "report", d, ("scaled_sum",), 200)


@pytest.mark.slow
def test_50_smollm2_prompts_report(smollm2, tmp_path):
    from sinklens.samplers.capture import CaptureOptions

    prompts = write_prompts(tmp_path / "p.jsonl", 50)
    path = run_corpus(CorpusConfig(model="smollm2-135m-instruct", prompts=str(prompts), out=str(tmp_path / "run"),
                                   sampler_args={"max_new_tokens": 1}, keep_traces=2,
                                   capture=CaptureOptions(**ALL_READOUTS, lens_layers=[29])), model=smollm2)
    d = _report(Path(path), tmp_path / "report")
    assert d["num_prompts"] == 50 and d["causal"] is True
    assert set(d["views"]) == {"scaled_sum", "uniform_ratio"}        # causal: the baseline view beside the raw one
    v = d["views"]["scaled_sum"]
    assert v["steps"] == 50 and len(v["layer_head"]["sink_rate"]) == 30    # one step each: the prefill
    _shows_every_readout(tmp_path / "report", d, ("scaled_sum", "uniform_ratio"), 50)


@pytest.mark.parametrize("command, argv, splits", [
    ("trace", ["--model", "m", "--prompts", "p.jsonl", "--out", "o"], True),
    ("trace", ["--model", "m", "--prompts=p.jsonl", "--out", "o"], True),
    ("trace", ["--model", "m", "--prompt", "hi", "--out", "o.arrow"], False),
    ("eval", ["--model", "m"], True),
    ("report", ["c.jsonl", "--out", "o"], False),
])
def test_only_a_corpus_trace_splits_over_launcher_processes(command, argv, splits):
    from sinklens.cli.launch import splits_work

    assert splits_work(command, argv) is splits


@pytest.mark.slow
def test_documented_corpus_example_runs_as_written_in_an_empty_folder(tmp_path):
    """docs/corpus.md's first example, word for word, in a folder holding nothing (a new user has
    no prompts.jsonl: the example makes one), with `sinklens` this checkout's command line."""
    text = (REPO / "docs" / "corpus.md").read_text().split("<!-- corpus-example", 1)[1]
    block = text.split("```bash\n", 1)[1].split("```", 1)[0]
    script = f'sinklens() {{ "{sys.executable}" -m sinklens.cli "$@"; }}\nset -e\n{block}'
    res = subprocess.run(["bash", "-c", script], cwd=tmp_path, env=_env(), capture_output=True, text=True,
                         timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    c = open_corpus(tmp_path / "runs" / "corpus" / "corpus.jsonl")
    assert c.num_prompts == 3, "the example's three prompts"
    assert (tmp_path / "report" / "index.html").is_file() and (tmp_path / "report0" / "index.html").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["prompts.jsonl", "report", "report0", "runs"]


def test_a_second_corpus_run_on_the_same_out_is_refused_in_one_line(tmp_path, capsys):
    """`sinklens trace --prompts` into a folder another process is writing: one line naming the
    command (not 'sinklens eval'), exit 2, no trace computed."""
    from sinklens.cli import main
    from sinklens.runlock import RunLock

    prompts = write_prompts(tmp_path / "p.jsonl", 2)
    out = tmp_path / "run"
    with RunLock(str(out), who="sinklens trace --prompts"):
        assert main(["trace", "--model", "tiny-dlm", "--prompts", str(prompts), "--out", str(out), "-q"]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("sinklens ")]
    assert len(err) == 1 and "another sinklens trace --prompts is already writing" in err[0], err
    assert not (out / "corpus.jsonl").exists()
