"""The eval never loses or poisons a run: bad settings, bad data lines, two writers, a full disk.

Model: `tiny_dlm` (conftest.py). Every check that needs no model (argument parsing, summary
layout, the record writer) runs without one, so the file stays fast.
"""
import errno
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from sinklens.cli import main
from sinklens.eval import records
from sinklens.eval.rundir import RunLock
from sinklens.eval.runner import EvalConfig, run_eval, sampler_settings
from sinklens.eval.summary import render, summarize_run, write_summary
from sinklens.samplers.capture import CaptureOptions

torch.set_num_threads(1)
REPO = Path(__file__).resolve().parents[1]
GSM8K = REPO / ".." / "shared" / "data" / "gsm8k" / "test.jsonl"
FAST = ["--task", "gsm8k", "--data", str(GSM8K), "--mask-topk", "1", "--shots", "0", "--gen-length", "8",
        "--block-length", "4", "--no-progress", "--no-loglik"]


def cli(*args):
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    return [sys.executable, "-m", "sinklens.cli", *args], env


def files_under(path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in Path(path).rglob("*") if p.is_file())


def error_lines(stderr: str) -> list[str]:
    """sinklens' own error lines (model loading prints progress bars and warnings of its own)."""
    return [line for line in stderr.splitlines() if line.startswith("sinklens ")]


def run_dir_of(out, model) -> Path:
    return Path(out) / Path(model).name / "gsm8k" / "k1"


# --- numeric flags: one line, exit 2, nothing written ------------------------------------------

@pytest.mark.parametrize("argv,flag", [
    (["eval", *FAST, "--gen-length", "-5"], "--gen-length"),
    (["eval", *FAST, "--gen-length", "0"], "--gen-length"),
    (["eval", *FAST, "--steps", "0"], "--steps"),
    (["eval", *FAST, "--block-length", "0"], "--block-length"),
    (["eval", *FAST, "--limit", "0"], "--limit"),
    (["eval", *FAST, "--shots", "-1"], "--shots"),
    (["eval", *FAST, "--mask-threshold", "-1"], "--mask-threshold"),
    (["eval", *FAST, "--mask-threshold", "nan"], "--mask-threshold"),
    (["eval", *FAST, "--ranking", "nan"], "--ranking"),              # an old spelling, named as typed
    (["eval", *FAST, "--sandbox-timeout", "0"], "--sandbox-timeout"),
    (["eval", *FAST, "--shots", "9"], "--shots"),
    (["eval", *FAST, "--limit", "0"], "--limit"),
    (["eval", *FAST, "--mask-units", "median"], "--mask-units"),
    (["eval", *FAST, "--mask-topk", "0,-1"], "--mask-topk"),
    (["trace", "--input-ids", "1,2", "--query-chunk", "-1"], "--query-chunk"),
    (["trace", "--input-ids", "1,2", "--query-chunk", "0"], "--query-chunk"),
    (["generate", "--input-ids", "1,2", "--steps", "0"], "--steps"),
    (["generate", "--input-ids", "1,2", "--time-eps", "nan"], "--time-eps"),
    (["generate", "--input-ids", "1,2", "--top-p", "2"], "--top-p"),
    (["generate", "--input-ids", "1,2", "--temperature", "inf"], "--temperature"),
    (["report", "t.arrow", "--sink-eps", "nan"], "--sink-eps"),
    (["report", "t.arrow", "--eps", "-1"], "--eps"),
    (["report", "t.arrow", "--row", "-1"], "--row"),
])
def test_bad_numbers_are_one_line_errors(argv, flag, tmp_path, capsys):
    out = tmp_path / "out"
    argv = [*argv, "--out", str(out)] + ([] if argv[0] == "report" else ["--model", "m"])
    with pytest.raises(SystemExit) as e:
        main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and len(err.strip().splitlines()) == 1, err
    assert f"argument {flag}" in err and "error:" in err
    assert not out.exists()


@pytest.mark.parametrize("argv,expected", [
    (["--task", "arith", "--shots", "3"], "--shots 3: task arith has no few-shot exemplars"),
    (["--task", "humaneval", "--shots", "2"], "--shots 2: task humaneval has no few-shot exemplars"),
    (["--task", "arith", "--sandbox-timeout", "3"], "--sandbox-timeout 3: task arith runs no code"),
    (["--task", "gsm8k", "--data", str(GSM8K), "--sandbox-timeout", "30"], "task gsm8k runs no code"),
    (["--task", "arith", "--mask-control", "random"], "--mask-topk has none (only 0)"),    # it ran K=0 alone
    (["--task", "arith", "--sandbox", "fallback"], "--sandbox fallback: task arith runs no code"),
])
def test_a_flag_of_another_task_is_refused_not_ignored(argv, expected, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["eval", "--model", "tiny-dlm", *argv, "--out", str(out)]) == 2
    err = error_lines(capsys.readouterr().err)
    assert len(err) == 1 and expected in err[0], err
    assert not out.exists()
    # what holds for every task is accepted: no exemplars, the defaults
    EvalConfig(model="m", task="arith", out=str(out), shots=0)
    EvalConfig(model="m", task="humaneval", out=str(out), sandbox_timeout=30)
    EvalConfig(model="m", task="gsm8k", out=str(out), shots=3)


def test_humaneval_without_bubblewrap_is_refused_before_the_model_loads(tmp_path, capsys, monkeypatch):
    """No silent fallback for model-written code: `eval --task humaneval` on a machine whose
    bubblewrap is missing says so in one line (what to install, or --sandbox fallback), exit 2,
    before any model loads or file is written; naming the fallback passes that check."""
    import shutil
    import sinklens.sandbox.isolation as iso_mod
    real_which = shutil.which
    monkeypatch.setattr(iso_mod.shutil, "which", lambda name: None if name == "bwrap" else real_which(name))
    iso_mod.probe.cache_clear()
    loads = []
    monkeypatch.setattr("sinklens.models.loader.load", lambda *a, **k: loads.append(a) or 1 / 0)
    try:
        out = tmp_path / "out"
        assert main(["eval", "--model", "tiny-dlm", "--task", "humaneval", "--out", str(out)]) == 2
        err = error_lines(capsys.readouterr().err)
        assert len(err) == 1 and "bubblewrap" in err[0] and "--sandbox fallback" in err[0], err
        assert not out.exists() and loads == []
        cfg = EvalConfig(model="m", task="humaneval", out=str(out), sandbox="fallback")
        assert cfg.sandbox_config().mode == "fallback"
    finally:
        iso_mod.probe.cache_clear()


def test_library_rejects_zero_instead_of_defaulting(tmp_path):
    base = dict(model="m", task="gsm8k", out=str(tmp_path))
    for field, value in [("gen_length", 0), ("limit", 0), ("shots", 9),
                         ("threshold", float("nan")), ("threshold", -1.0), ("sandbox_timeout", 0)]:
        with pytest.raises(ValueError, match=field.replace("_", "-")):
            EvalConfig(**base, **{field: value})
    for args, match in [({"steps": 0}, "steps must be a positive integer"),
                        ({"block_length": -4}, "block_length must be a positive integer"),
                        ({"alg": "nope"}, "alg must be one of"), ({"stpes": 8}, "unknown sampler argument 'stpes'")]:
        with pytest.raises(ValueError, match=match):
            EvalConfig(**base, sampler_args=args)
    def model(sampler):  # what the length policy reads of a SinkModel
        return SimpleNamespace(family=SimpleNamespace(sampler=sampler), max_length=None, source={})

    for gen, kwargs in [(0, {}), (None, dict(steps=0)), (None, dict(block_length=0)), (8, dict(steps=3, block_length=4))]:
        with pytest.raises(ValueError):
            sampler_settings(model("llada"), "gsm8k", gen, **kwargs)
    with pytest.raises(ValueError):
        sampler_settings(model("dream"), "gsm8k", steps=0)
    with pytest.raises(ValueError, match="the arm sampler got unknown argument"):
        sampler_settings(model("arm"), "gsm8k", steps=8)
    with pytest.raises(ValueError, match="query_chunk"):
        CaptureOptions(query_chunk=-1)


# --- a rejected run writes nothing and blocks nothing -------------------------------------------

def test_rejected_run_leaves_nothing_and_next_run_proceeds(tiny_dlm, tmp_path, capsys):
    out = tmp_path / "out"
    base = ["eval", "--model", tiny_dlm, "--out", str(out), *FAST, "--limit", "1"]
    # longer than the model's context (4096 tokens) / steps not divisible by the 2 blocks
    for extra, match in [(["--gen-length", "4096"], "exceeds the context"), (["--steps", "3"], "divisible")]:
        assert main([*base, *extra]) == 2
        err = error_lines(capsys.readouterr().err)
        assert len(err) == 1 and match in err[0], err
        assert not out.exists()
    # a folder left by an older sinklens (config.json + empty shard, other settings) does not block either
    stale = run_dir_of(out, tiny_dlm)
    stale.mkdir(parents=True)
    (stale / "config.json").write_text(json.dumps({"model": tiny_dlm, "settings": {"gen_length": 99}, "config": {}}))
    (stale / "samples.rank0.jsonl").write_text("")
    assert main(base) == 0
    capsys.readouterr()
    assert [r["id"] for r in records.collect(str(stale))] == ["line1"]
    assert json.loads((stale / "config.json").read_text())["settings"]["gen_length"] == 8


# --- bad data lines: skipped, file:line, printed once, in config.json -----------------------------

def test_bad_data_lines_are_skipped_and_recorded(tiny_dlm, tmp_path, capsys):
    good = GSM8K.read_bytes().splitlines()[:3]
    data = tmp_path / "bad.jsonl"
    data.write_bytes(b"\n".join([b"\xef\xbb\xbf" + good[0], b"\xff garbage", b'{"question": "q", "answer": null}',
                                 b'{"question": "q", "answer": "no final answer"}', good[1], good[2]]) + b"\n")
    cfg = EvalConfig(model=tiny_dlm, task="gsm8k", out=str(tmp_path / "out"), data=str(data), mask_topk=(1,),
                     shots=0, gen_length=8, sampler_args={"block_length": 4}, loglik=False, progress=False)
    (run_dir,) = run_eval(cfg)
    assert [r["id"] for r in records.collect(run_dir)] == ["line1", "line5", "line6"]     # BOM line kept
    skipped = json.loads(Path(run_dir, "config.json").read_text())["data_errors"]
    assert [e.split(": ")[0] for e in skipped] == [f"{data}:{n}" for n in (2, 3, 4)]
    err = capsys.readouterr().err
    assert all(err.count(e) == 1 for e in skipped)                                     # printed once each


def test_problem_longer_than_the_context_is_skipped_not_fatal(tiny_dlm, tmp_path, capsys):
    good = GSM8K.read_text().splitlines()[:2]
    long = json.loads(good[0])
    long["question"] = " ".join([long["question"]] * 150)          # far beyond the 4096-token context
    data = tmp_path / "long.jsonl"
    data.write_text("\n".join([good[0], json.dumps(long), good[1]]) + "\n")
    out = tmp_path / "out"
    assert main(["eval", "--model", tiny_dlm, "--out", str(out), *FAST[:2], "--data", str(data), *FAST[4:]]) == 0
    run_dir = run_dir_of(out, tiny_dlm)
    assert [r["id"] for r in records.collect(str(run_dir))] == ["line1", "line3"]
    (skipped,) = json.loads((run_dir / "config.json").read_text())["data_errors"]
    assert skipped.startswith(f"{data}:2: prompt ") and "exceeds the context" in skipped
    err = error_lines(capsys.readouterr().err)
    assert err[-1] == ("sinklens eval: skipped 1 of 3 problems (1 longer than the model's context); "
                       "config.json data_errors lists each with its file:line"), err


def test_eval_and_replicate_json_give_the_runs_and_their_numbers(tiny_dlm, tmp_path, capsys, monkeypatch):
    out = tmp_path / "out"
    assert main(["eval", "--model", tiny_dlm, "--out", str(out / "eval"), *FAST, "--limit", "2", "--json"]) == 0
    captured = capsys.readouterr().out
    assert len(captured.strip().splitlines()) == 1                      # the JSON line only, no table
    doc = json.loads(captured)
    (run,) = doc["runs"]
    assert Path(doc["summary_md"]).is_file() and run["run_dir"] == str(run_dir_of(out / "eval", tiny_dlm))
    assert run["mask_topk"] == 1 and run["n"] == 2 and 0 <= run["accuracy"] <= 1 and run["sinks"] == "topk"
    # replicate --json reads the same runs from its eval folder (the twins' runs are replaced by this one)
    import sinklens.experiments.replicate as rep

    # what replicate returns: the table's text (markdown, CSV), the other results' paths
    files = {"summary_md": "| task | masking |\n|---|---|", "summary_csv": "task,masking", "report": "index.html",
             "persistence_md": "p.md"}
    monkeypatch.setattr(rep, "replicate", lambda *a, **k: files)
    assert main(["replicate", "--out", str(out), "--json", "-q"]) == 0
    doc = json.loads(capsys.readouterr().out)
    table = out / "eval" / "summary.md"               # a path for a machine, not the table's text
    assert doc["table"] == str(table) and doc["table_csv"] == str(out / "eval" / "summary.csv") and doc["runs"] == [run]
    assert main(["replicate", "--out", str(out), "-q"]) == 0
    text = capsys.readouterr().out.splitlines()
    assert text[:2] == files["summary_md"].splitlines() and f"table: {table} (and .csv)" in text


# --- two writers into one --out -----------------------------------------------------------------

@pytest.mark.slow
def test_second_process_is_refused_and_nothing_runs_twice(tiny_dlm, tmp_path):
    out = tmp_path / "out"
    cmd, env = cli("eval", "--model", tiny_dlm, "--out", str(out), *FAST, "--limit", "200")
    first = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    shard = run_dir_of(out, tiny_dlm) / "samples.rank0.jsonl"
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not records.read_records(str(shard))[0]:
            time.sleep(0.05)
        assert records.read_records(str(shard))[0], "the first process never wrote a sample"
        second = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
        assert first.poll() is None, "the first process ended before the second one tried"
    finally:
        first.kill()                                   # kill -9: its lock goes with it
        first.wait()
    assert second.returncode == 2 and "Traceback" not in second.stderr
    assert error_lines(second.stderr) == [f"sinklens eval: error: another sinklens eval is already writing "
                                     f"{shard.parent} (pid {first.pid}); wait for it or use another --out"]
    ids = [r["id"] for r in records.read_records(str(shard))[0]]
    assert ids and len(ids) == len(set(ids))           # each sample once
    # the kill -9 released the lock: the same command resumes in this process
    n = len(ids) + 1
    cfg = EvalConfig(model=tiny_dlm, task="gsm8k", out=str(out), data=str(GSM8K), limit=n, mask_topk=(1,),
                     shots=0, gen_length=8, sampler_args={"block_length": 4}, loglik=False, progress=False)
    run_eval(cfg)
    ids = [r["id"] for r in records.read_records(str(shard))[0]]
    assert ids == [f"line{i}" for i in range(1, n + 1)]


def test_lock_is_per_rank_and_names_the_holder(tmp_path):
    with RunLock(str(tmp_path), rank=0):
        with RunLock(str(tmp_path), rank=1):           # data-parallel ranks write side by side
            pass
        with pytest.raises(RuntimeError, match=rf"already writing {tmp_path} \(pid {os.getpid()}\)"):
            with RunLock(str(tmp_path), rank=0):
                pass
    with RunLock(str(tmp_path), rank=0):               # released on exit
        pass


def test_the_lock_is_taken_before_the_model_loads(tmp_path, monkeypatch, capsys):
    """A second writer into the same --out (eval, a corpus run, a single trace) is refused before
    any model loads (it used to pay a full load first); a run refused after taking the lock leaves
    no folder or file behind."""
    from sinklens.runlock import FileLock

    loads = []

    def load(*args, **kwargs):
        loads.append(args)
        raise RuntimeError("the model failed to load")

    monkeypatch.setattr("sinklens.models.loader.load", load)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "hi"}\n')
    runs = [(tmp_path / "e" / "tiny-dlm" / "arith" / "k0", RunLock, "sinklens eval",
             ["eval", "--model", "tiny-dlm", "--task", "arith", "--out", str(tmp_path / "e")]),
            (tmp_path / "c", RunLock, "sinklens trace --prompts",
             ["trace", "--model", "tiny-dlm", "--prompts", str(prompts), "--out", str(tmp_path / "c")]),
            (tmp_path / "t.arrow", FileLock, "sinklens trace",
             ["trace", "--model", "tiny-dlm", "--prompt", "hi", "--out", str(tmp_path / "t.arrow")])]
    for held, lock, who, argv in runs:
        with lock(str(held)):
            assert main([*argv, "-q"]) == 2
        err = error_lines(capsys.readouterr().err)
        assert len(err) == 1 and f"another {who} is already writing {held}" in err[0], err
    assert loads == []
    for held, lock, who, argv in runs:                 # the load fails: nothing left behind
        shutil.rmtree(tmp_path / "e", ignore_errors=True)
        shutil.rmtree(tmp_path / "c", ignore_errors=True)
        (tmp_path / "t.arrow").unlink(missing_ok=True)
        assert main([*argv, "-q"]) == 1
        assert "the model failed to load" in capsys.readouterr().err
        assert sorted(p.name for p in tmp_path.iterdir()) == ["p.jsonl"], argv


# --- disk full / file-size limit ------------------------------------------------------------------

def test_failed_write_leaves_no_torn_line(tmp_path, monkeypatch):
    path = str(tmp_path / "s.jsonl")
    w = records.RecordWriter(path)
    w.write({"id": "a", "index": 0})
    real_write = os.write

    def half_then_full(fd, data):                      # the disk fills up in the middle of a line
        if fd != w.fd:
            return real_write(fd, data)
        if len(data) > 10:
            return real_write(fd, bytes(data[:10]))
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(records.os, "write", half_then_full)
    with pytest.raises(records.WriteError, match=r"could not write .*s\.jsonl \(No space left on device\)"):
        w.write({"id": "b", "index": 1, "text": "x" * 100})
    monkeypatch.setattr(records.os, "write", real_write)
    w.write({"id": "c", "index": 2})                   # space again: the next line starts clean
    w.close()
    assert [json.loads(line)["id"] for line in open(path)] == ["a", "c"]


@pytest.mark.slow
def test_file_size_limit_stops_cleanly_and_rerun_resumes(tiny_dlm, tmp_path):
    out = tmp_path / "out"
    cmd, env = cli("eval", "--model", tiny_dlm, "--out", str(out), *FAST, "--limit", "6")
    shard = run_dir_of(out, tiny_dlm) / "samples.rank0.jsonl"

    def limit_file_size():                             # SIGXFSZ ignored (as CPython does): write gets EFBIG
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (4500, 4500))

    full = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, preexec_fn=limit_file_size)
    kept = len(records.read_records(str(shard))[0])
    assert full.returncode == 1 and 1 <= kept < 6, full.stderr
    assert error_lines(full.stderr) == [f"sinklens eval: error: could not write {shard} (File too large); "
                                                    f"{kept} samples kept, re-running the same command resumes"]
    assert "Traceback" not in full.stderr
    assert shard.read_bytes().endswith(b"\n")          # no torn line left behind
    again = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    ids = [json.loads(line)["id"] for line in open(shard)]
    assert ids == [f"line{i}" for i in range(1, 7)]


# --- summary: every differing setting is a row; the caption says what ran ------------------------

def _fake_run(root: Path, name: str, k: int, gen: int, control: str | None, correct: list[bool], model="m1"):
    d = root / name
    d.mkdir(parents=True)
    masking = {"top_k": k, "threshold": None, "ranking": "per_head", "keep_self": False, "step0": "unmasked",
               "units": "column_sum"}
    if control is not None:                            # old config.json files have no control key
        masking["control"] = control
    meta = {"model": model, "task": "gsm8k", "mask_topk": k, "masking": masking, "sampler": "llada",
            "settings": {"gen_length": gen, "steps": gen, "block_length": 4}, "n_expected": len(correct),
            "config": {"out": str(root), "limit": len(correct), "gen_length": gen, "progress": False,
                       "ranking": "per_head", "shots": 0, "mask_topk": [0, 1]}}
    (d / "config.json").write_text(json.dumps(meta))
    (d / "samples.rank0.jsonl").write_text("".join(
        json.dumps({"id": f"line{i}", "index": i, "correct": c}) + "\n" for i, c in enumerate(correct)))


def test_summary_rows_keep_every_setting_and_put_controls_beside(tmp_path):
    _fake_run(tmp_path, "a/k0", 0, 8, None, [True, True])
    _fake_run(tmp_path, "a/k1", 1, 8, None, [True, False])
    _fake_run(tmp_path, "b/k1", 1, 16, "none", [False, False])       # same model, other gen length
    _fake_run(tmp_path, "b/k1-random", 1, 16, "random", [True, True])
    _fake_run(tmp_path, "c/k1", 1, 8, None, [False, True], model="m2")  # second model, same settings as a/k1
    (tmp_path / "empty").mkdir()                                       # a rejected run: no row
    (tmp_path / "empty" / "config.json").write_text(json.dumps({"model": "m1", "settings": {"gen_length": 3}}))
    (tmp_path / "empty" / "samples.rank0.jsonl").write_text("")
    md, csv_text = write_summary([str(tmp_path)], str(tmp_path))
    rows = [line for line in md.splitlines() if line.startswith("| gsm8k")]
    assert rows == [
        "| gsm8k | Unmasked, gen_length=8, steps=8 | 1.00 ± 0.00 (n=2) | – |",
        "| gsm8k | K=1 (ε0), gen_length=8, steps=8 | 0.50 ± 0.50 (n=2) | 0.50 ± 0.50 (n=2) |",
        "| gsm8k | K=1 (ε0), gen_length=16, steps=16 | 0.00 ± 0.00 (n=2) | – |",
        "| gsm8k | K=1 random keys (control), gen_length=16, steps=16 | 1.00 ± 0.00 (n=2) | – |",
    ]
    caption = md.strip().splitlines()[-1]
    assert caption.startswith("Tasks: gsm8k; cells: accuracy (gsm8k) ± standard error")
    assert "ranking=per_head" in caption and "units=column_sum" in caption and "random keys" in caption
    assert "HumanEval" not in caption and "previous step" not in caption
    assert len(csv_text.strip().splitlines()) == 1 + 5


def test_summary_never_overwrites_files_it_did_not_write(tiny_dlm, tmp_path, capsys):
    """--out holding the user's own summary.md is refused by eval before the model loads, and by
    eval-summary; an earlier summary there is replaced."""
    _fake_run(tmp_path / "runs", "a/k0", 0, 8, None, [True])
    mine = tmp_path / "project"
    mine.mkdir()
    (mine / "summary.md").write_text("# my notes\n")
    assert main(["eval-summary", str(tmp_path / "runs"), "--out", str(mine), "-q"]) == 2
    err = error_lines(capsys.readouterr().err)
    assert len(err) == 1 and "holds summary.md that no sinklens eval summary wrote" in err[0], err
    assert main(["eval", "--model", tiny_dlm, "--out", str(mine), *FAST, "--limit", "1"]) == 2
    assert "holds summary.md" in capsys.readouterr().err
    assert sorted(p.name for p in mine.iterdir()) == ["summary.md"]          # no run started beside it
    assert (mine / "summary.md").read_text() == "# my notes\n"
    assert main(["eval-summary", str(tmp_path / "runs"), "-q"]) == 0         # into the runs' own folder
    assert main(["eval-summary", str(tmp_path / "runs"), "-q"]) == 0         # and again: its own summary replaced
    assert (tmp_path / "runs" / "summary.csv").read_text().startswith("model,task,mask_topk,")


def test_summary_skips_a_corpus_run_beside_the_eval_runs(tmp_path, capsys):
    """A `sinklens trace --prompts` folder also holds config.json + samples.rank0.jsonl, without
    verdicts: eval-summary skips it (it failed with the bare line 'error: correct')."""
    corpus = tmp_path / "runs" / "corpus"
    corpus.mkdir(parents=True)
    (corpus / "config.json").write_text(json.dumps({"sinklens_corpus": 1, "model": "m1", "num_layers": 2}))
    (corpus / "samples.rank0.jsonl").write_text(json.dumps({"index": 0, "id": "line1", "parts": {}}) + "\n")
    assert main(["eval-summary", str(tmp_path / "runs"), "-q"]) == 2
    err = error_lines(capsys.readouterr().err)
    assert len(err) == 1 and "no eval runs" in err[0], err
    _fake_run(tmp_path / "runs", "m1/k0", 0, 8, None, [True, False])
    md, _ = write_summary([str(tmp_path / "runs")], str(tmp_path / "runs"))
    assert [line for line in md.splitlines() if line.startswith("| gsm8k")] == \
        ["| gsm8k | Unmasked | 0.50 ± 0.50 (n=2) |"]


def test_summary_same_settings_in_two_folders_are_both_shown(tmp_path):
    _fake_run(tmp_path / "x", "k1", 1, 8, None, [True])
    _fake_run(tmp_path / "y", "k1", 1, 8, None, [False])
    md, _ = render([summarize_run(str(tmp_path / d / "k1")) for d in "xy"])
    rows = [line for line in md.splitlines() if line.startswith("| gsm8k")]
    assert len(rows) == 2 and "run_dir=" in rows[0]


def test_a_local_folder_typed_another_way_is_the_same_model(tmp_path):
    """`--model ./m/` then `--model m` resume one run (they were refused as 'differs in [model]');
    an alias or hub id is kept as given."""
    from sinklens.eval.corpus import CorpusConfig

    folder = tmp_path / "my-llada"
    folder.mkdir()
    names = {str(folder), str(folder) + "/", str(tmp_path / "." / "my-llada") + "//"}
    assert {EvalConfig(model=n, task="arith", out=str(tmp_path / "o")).model for n in names} == {str(folder)}
    assert {CorpusConfig(model=n, prompts="p.jsonl", out="o").model for n in names} == {str(folder)}
    assert EvalConfig(model="GSAI-ML/LLaDA-8B-Instruct", task="arith", out=str(tmp_path / "o")).model == \
        "GSAI-ML/LLaDA-8B-Instruct"


@pytest.mark.slow
def test_each_k_runs_once_and_the_unmasked_run_first(tmp_path, capsys):
    """`--mask-topk 1,0,1`: K=1 twice stopped the eval at its second run (refused by the first's
    lock, 'another sinklens eval is already writing'), and K=1 before K=0 left its KL 'n/a'."""
    assert EvalConfig(model="m", task="arith", out=str(tmp_path), mask_topk=(1, 0, "5%", 1, "5%")).mask_topk == \
        (0, 1, "5%")
    out = tmp_path / "ev"
    assert main(["eval", "--model", "tiny-dlm", "--task", "arith", "--limit", "1", "--mask-topk", "1,0,1",
                 "--out", str(out), "-q"]) == 0
    md = capsys.readouterr().out
    assert sorted(p.name for p in (out / "tiny-dlm" / "arith").iterdir()) == ["k0", "k1"]
    outcome = next(line for line in md.splitlines() if line.startswith("| arith | K=1") and "sim " in line)
    assert "KL n/a" not in outcome, outcome


@pytest.mark.slow
def test_quiet_eval_prints_results_only(tmp_path):
    """-q: the small-model thread note (on stderr, even under --quiet) is gone; errors still come."""
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}   # else the thread choice is not made
    env["PYTHONPATH"] = str(REPO)
    cmd = [sys.executable, "-m", "sinklens.cli", "eval", "--model", "tiny-dlm", "--task", "arith", "--limit", "1",
           "--out", str(tmp_path / "ev")]
    loud = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert loud.returncode == 0, loud.stderr
    if (os.cpu_count() or 1) > 1:          # one core: torch already runs one thread, nothing to choose or say
        assert "note: 10M parameters or fewer on CPU: 1 torch thread" in loud.stderr, loud.stderr
    quiet = subprocess.run([*cmd, "-q"], env=env, capture_output=True, text=True, timeout=300)
    assert quiet.returncode == 0 and quiet.stderr == "" and "| arith | Unmasked |" in quiet.stdout, quiet.stderr
    # the table, then where it and the runs are (a result: said under -q too)
    assert f"wrote {tmp_path / 'ev' / 'summary.md'} and summary.csv; each run's samples and settings in " \
           f"{tmp_path / 'ev' / 'tiny-dlm' / 'arith' / 'k<K>'}/" in quiet.stdout.splitlines()[-1]


@pytest.mark.slow
def test_file_size_limit_names_the_file_and_what_is_kept(tmp_path):
    """`ulimit -f` hit while a trace is written: pyarrow's "File too large" names no file; the
    command's one line names it, and for a corpus run says that the same command resumes."""
    def small_files():
        resource.setrlimit(resource.RLIMIT_FSIZE, (25_000, 25_000))

    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "Tom has 3 apples"}\n{"prompt": "Ann has 2 pears"}\n')
    runs = {tmp_path / "t.arrow": ["--prompt", "Tom has 3 apples"],
            tmp_path / "c": ["--prompts", str(prompts), "--keep-traces", "2"]}
    for out, argv in runs.items():
        run = subprocess.run([sys.executable, "-m", "sinklens", "trace", "--model", "tiny-dlm", *argv, "--out", str(out),
                              "-q"], env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])},
                             capture_output=True, text=True, timeout=600, preexec_fn=small_files)
        err = error_lines(run.stderr)
        assert run.returncode == 1 and len(err) == 1 and "File too large" in err[0], run.stderr[-2000:]
        written = out if out.suffix else out / "traces" / "000000.arrow"
        assert f"could not write {written} (" in err[0]
        assert ("the same command resumes" in err[0]) == (not out.suffix), err[0]
