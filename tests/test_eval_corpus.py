"""`sinklens eval --attention-stats`: every row (unmasked, masked K, random control) also writes a
corpus file of its generations. Tracing changes no token (the eval's records are those of the
untraced eval), each line is the corpus mode's reduction of that sample's trace, a sample redone
after a kill counts once, and 2 processes write the same files as 1.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from sinklens.analysis.corpus import open_corpus
from sinklens.cli import main
from sinklens.eval.corpus import reduce_trace
from sinklens.eval.runner import EvalConfig, run_eval

REPO = Path(__file__).resolve().parents[1]
ROWS = ("k0", "k1", "k1-random")


@pytest.fixture(scope="module")
def models():
    from sinklens.models.loader import load

    return {name: load(name, dtype="float32") for name in ("tiny-dlm", "tiny-arm")}


def _cfg(model: str, out, **kw) -> EvalConfig:
    fast = {"tiny-dlm": dict(gen_length=8, sampler_args={"steps": 4, "block_length": 8}),
            "tiny-arm": dict(gen_length=6)}[model]
    return EvalConfig(model=model, task="arith", out=str(out), limit=2, mask_topk=(0, 1), mask_control="random",
                      loglik=False, progress=False, **fast, **kw)


def _records(run_dir: str) -> tuple[list[dict], list[float]]:
    """(the records without wall-clock timing, their outcome KLs). Traced, the unmasked row's
    attention runs on the capture route, not SDPA: the same tokens, logits equal to float rounding,
    so the KL against it is compared to 1e-5, everything else exactly."""
    recs = [json.loads(x) for x in open(os.path.join(run_dir, "samples.jsonl"))]
    kls = []
    for r in recs:
        r.pop("timing")
        if r.get("outcome"):
            kls.append(r["outcome"].pop("kl"))
    return recs, kls


@pytest.mark.slow
@pytest.mark.parametrize("name", ["tiny-dlm", "tiny-arm"])
def test_traced_eval_has_the_same_records_and_one_corpus_per_row(models, name, tmp_path):
    plain = run_eval(_cfg(name, tmp_path / "plain"), model=models[name])
    traced = run_eval(_cfg(name, tmp_path / "traced", attention_stats=True, keep_traces=2), model=models[name])
    assert [os.path.basename(d) for d in traced] == list(ROWS)
    sinks = {}
    for p, t in zip(plain, traced):
        (traced_recs, traced_kl), (plain_recs, plain_kl) = _records(t), _records(p)
        assert traced_recs == plain_recs                  # same tokens, same verdicts, same masking summaries
        # KL to the unmasked run: the capture route's output is within ~1e-6 of sdpa's (the compiled route sums
        # in its own order), and a small KL moves by ~1e-4 of itself
        assert traced_kl == pytest.approx(plain_kl, rel=2e-4, abs=1e-7)
        assert not os.path.exists(os.path.join(p, "corpus"))
        c = open_corpus(os.path.join(t, "corpus", "corpus.jsonl"))   # what `sinklens report` reads
        assert c.num_prompts == 2 and c.meta["complete"] and c.meta["eval"]["task"] == "arith"
        assert [r["text"] for r in c.records] == [r["raw_output"] for r in traced_recs]
        for r in map(json.loads, open(os.path.join(t, "corpus", "corpus.jsonl")).readlines()[1:]):
            assert r["parts"] == reduce_trace(os.path.join(t, "corpus", r["trace"]), c.meta["units"],
                                              c.meta["sink_eps"])   # each line: the corpus mode's reduction
        sinks[os.path.basename(t)] = c.layer_head()["sinks_per_step"]
    # the rows are their own generations, not one corpus copied three times
    assert not np.array_equal(sinks["k0"], sinks["k1"])


def test_a_sample_redone_after_a_kill_counts_once(models, tmp_path):
    m = models["tiny-dlm"]
    dirs = run_eval(_cfg("tiny-dlm", tmp_path, attention_stats=True), model=m)
    row = Path(dirs[1])
    clean = (row / "corpus" / "corpus.jsonl").read_bytes()
    # killed after sample 1's corpus line, before its record line: the record goes, the line stays
    shard = row / "samples.rank0.jsonl"
    shard.write_bytes(b"".join(shard.read_bytes().splitlines(keepends=True)[:1]))
    for merged in (row / "samples.jsonl", row / "corpus" / "corpus.jsonl"):
        merged.unlink()
    run_eval(_cfg("tiny-dlm", tmp_path, attention_stats=True), model=m)
    assert len((row / "corpus" / "samples.rank0.jsonl").read_bytes().splitlines()) == 3   # sample 1 twice
    assert (row / "corpus" / "corpus.jsonl").read_bytes() == clean                         # counted once


def test_resuming_with_the_option_changed_is_refused(models, tmp_path):
    run_eval(_cfg("tiny-arm", tmp_path), model=models["tiny-arm"])
    with pytest.raises(ValueError, match="attention_stats"):
        run_eval(_cfg("tiny-arm", tmp_path, attention_stats=True), model=models["tiny-arm"])


def test_keep_traces_without_the_option_is_one_line(tmp_path, capsys):
    assert main(["eval", "--model", "tiny-dlm", "--task", "arith", "--keep-traces", "2",
                 "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--keep-traces" in err[0] and "--attention-stats" in err[0]
    assert not (tmp_path / "o").exists()


def _eval_args(out: Path) -> list[str]:
    return ["-m", "sinklens.cli", "eval", "--model", "tiny-dlm", "--task", "arith", "--limit", "4",
            "--mask-topk", "0,1", "--mask-control", "random", "--no-loglik", "--gen-length", "8", "--steps", "4",
            "--block-length", "8", "--attention-stats", "--quiet", "--out", str(out)]


@pytest.mark.slow
def test_two_processes_write_the_same_corpus_files_as_one(tmp_path):
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", "OMP_NUM_THREADS": "1",
           "CUDA_VISIBLE_DEVICES": ""}
    env.pop("WORLD_SIZE", None), env.pop("RANK", None)
    one = subprocess.run([sys.executable, *_eval_args(tmp_path / "one")], env=env, capture_output=True, text=True,
                         timeout=300)
    assert one.returncode == 0, one.stderr[-3000:]
    two = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                          *_eval_args(tmp_path / "two")], env=env, capture_output=True, text=True, timeout=300)
    assert two.returncode == 0, two.stderr[-3000:]
    for row in ROWS:
        rel = Path("tiny-dlm") / "arith" / row / "corpus"
        for r in (0, 1):                                  # each rank traced its own share
            lines = [json.loads(x) for x in open(tmp_path / "two" / rel / f"samples.rank{r}.jsonl")]
            assert [x["index"] for x in lines] == [r, r + 2]
        assert (tmp_path / "two" / rel / "corpus.jsonl").read_bytes() == \
            (tmp_path / "one" / rel / "corpus.jsonl").read_bytes()


def test_a_prompt_of_megabytes_is_skipped_by_its_length_before_tokenising(models, tmp_path, monkeypatch):
    """A corpus line of 10 MB stalled a run (minutes of templating and tokenising, GBs of memory,
    no output): refused by its length, which cannot fit the context whatever its tokens, and
    counted with the other skipped lines; the tokenizer never reads it."""
    from sinklens.eval.corpus import CorpusConfig, run_corpus

    m = models["tiny-dlm"]
    big = "x" * 10_000_000
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt": "Tom has 3 apples."}) + "\n" + json.dumps({"prompt": big}) + "\n")
    seen = []
    encode, template = m.tokenizer.encode, m.apply_chat_template
    monkeypatch.setattr(m.tokenizer, "encode", lambda text, *a, **k: seen.append(len(text)) or encode(text, *a, **k))
    monkeypatch.setattr(m, "apply_chat_template", lambda text: seen.append(len(text)) or template(text))
    cfg = CorpusConfig(model="tiny-dlm", prompts=str(prompts), out=str(tmp_path / "c"),
                       sampler_args={"gen_length": 4, "steps": 2, "block_length": 4})
    c = open_corpus(run_corpus(cfg, model=m))
    assert c.num_prompts == 1 and max(seen) < 1000
    (skipped,) = c.meta["skipped"]
    assert skipped.startswith(f"{prompts}:2: prompt of 10000000 characters exceeds the context of 'tiny-dlm'")
