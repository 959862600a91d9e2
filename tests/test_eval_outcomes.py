"""Outcomes beyond accuracy (sinklens.eval.outcomes): the readouts on their own, then through
`run_eval` on the shipped tiny twins: a masking that blocks nothing reads zero (similarity 1),
masking the sinks of tiny-dlm flips every answer; resume and the summary's later comparison."""
import csv
import math

import pytest
import torch

from sinklens.eval import outcomes, records
from sinklens.eval.runner import EvalConfig, run_eval

torch.set_num_threads(1)


def test_edit_distance_known_values():
    assert outcomes.edit_distance(list("kitten"), list("sitting")) == 3
    assert outcomes.edit_distance([], [1, 2]) == 2
    assert outcomes.edit_distance([1, 2, 3], [1, 2, 3]) == 0
    assert outcomes.edit_distance([1, 2, 3], [2, 3]) == 1          # one deletion, not three substitutions


def test_compare_identical_and_disjoint():
    a = {"output_ids": [1, 2, 3, 4], "extracted": "7"}
    same = outcomes.compare(a, dict(a), kl=0.0)
    assert same == {"edit_distance": 0.0, "similarity": 1.0, "same_position": 1.0, "flip": 0.0, "kl": 0.0,
                    "deferred": None, "commit_prob_change": None}          # no commits recorded: an ARM's records
    other = outcomes.compare(a, {"output_ids": [5, 6], "extracted": "8"})
    assert other["edit_distance"] == 1.0 and other["similarity"] == 0.0 and other["same_position"] == 0.0
    assert other["flip"] == 1.0 and other["kl"] is None
    shifted = outcomes.compare(a, {"output_ids": [0, 1, 2, 3, 4], "extracted": "7"})
    assert shifted["similarity"] == pytest.approx(0.8) and shifted["same_position"] == 0.0   # why both exist
    assert outcomes.compare({"output_ids": []}, {"output_ids": []})["similarity"] == 1.0


def test_commit_readouts_by_hand():
    """§5.2 on two records: of the unmasked run's 3 commits the masked run makes one later and one
    never (deferred 2/3); its mean probability at the positions it committed minus the unmasked one."""
    u = {"step": [0, 1, 2, -1], "prob": [0.9, 0.8, 0.7, None]}
    m = {"step": [0, 3, -1, -1], "prob": [0.6, 0.5, None, None]}
    r = outcomes.commit_readouts(u, m)
    assert r["deferred"] == pytest.approx(2 / 3)
    assert r["commit_prob_change"] == pytest.approx((0.6 + 0.5) / 2 - (0.9 + 0.8 + 0.7) / 3)
    assert outcomes.commit_readouts(u, u) == {"deferred": 0.0, "commit_prob_change": 0.0}
    assert outcomes.commit_readouts(None, m) == {"deferred": None, "commit_prob_change": None}
    rec = outcomes.compare({"output_ids": [1], "commits": u}, {"output_ids": [1], "commits": m})
    assert rec["deferred"] == r["deferred"]


def _commits(logits: torch.Tensor, ref=None) -> outcomes.CommitLogits:
    """A CommitLogits fed rows (N, V) at positions 10 .. 10 + N (ref: the unmasked top, for a masked run)."""
    c = outcomes.CommitLogits(prompt_len=10, arm=True, ref=ref)
    for i, row in enumerate(logits):
        c._keep(10 + i, row)
    return c


@pytest.mark.parametrize("vocab", [40, 500])
def test_kl_exact_for_small_vocab_else_a_lower_bound(vocab):
    g = torch.Generator().manual_seed(0)
    u, m = torch.randn(6, vocab, generator=g) * 3, torch.randn(6, vocab, generator=g) * 3
    lu, lm = torch.log_softmax(u.double(), -1), torch.log_softmax(m.double(), -1)
    full = float((lu.exp() * (lu - lm)).sum(-1).mean())
    top = _commits(u).top()
    kl = outcomes.kl_to_unmasked(top, _commits(m, ref=top).rows)
    if vocab <= outcomes.TOP:
        assert kl == pytest.approx(full, rel=1e-5)
    else:
        assert 0 < kl <= full + 1e-6
    assert outcomes.kl_to_unmasked(top, _commits(u, ref=top).rows) == pytest.approx(0.0, abs=1e-6)
    assert outcomes.kl_to_unmasked(top, {}) is None                                # no common position
    assert top["logp"].shape == (6, min(vocab, outcomes.TOP))                      # what a sample stores


def _run(model, out, **kw):
    cfg = EvalConfig(model=model, task="arith", out=str(out), progress=False, loglik=False, **kw)
    return {d.rsplit("/", 1)[1]: records.collect(d) for d in run_eval(cfg)}


@pytest.mark.slow
@pytest.mark.parametrize("model", ["tiny-dlm", "tiny-arm"])
def test_masking_that_blocks_nothing_reads_zero(model, tmp_path):
    """K = 1 with a threshold no key reaches: nothing is blocked, so the masked output is the
    unmasked one: distance 0, similarity 1, no flip, KL ~ 0 (the blocked path's rounding only)."""
    runs = _run(model, tmp_path, limit=3, mask_topk=(0, 1), threshold=1e9)
    assert all("outcome" not in r for r in runs["k0"])
    for r, u in zip(runs["k1"], runs["k0"]):
        assert r["output_ids"] == u["output_ids"] and r["output_ids"]
        o = r["outcome"]
        assert (o["edit_distance"], o["similarity"], o["same_position"], o["flip"]) == (0.0, 1.0, 1.0, 0.0)
        assert 0 <= o["kl"] < 1e-5
        if model == "tiny-dlm":     # §5.2 on a diffusion sampler: the same commits at the same steps
            assert r["commits"]["step"] == u["commits"]["step"] and min(u["commits"]["step"]) >= 0
            assert o["deferred"] == 0.0 and abs(o["commit_prob_change"]) < 1e-4
        else:                       # an ARM commits one position a step: nothing to defer
            assert "commits" not in r and o["deferred"] is None


@pytest.mark.slow
def test_masking_the_sinks_changes_everything_and_summary_reads_it(tmp_path):
    """tiny-dlm with its top-1 sink masked: every answer flips, the output moves, KL > 1 nat;
    the random-key control moves far less. Both rows in summary.md and summary.csv."""
    runs = _run("tiny-dlm", tmp_path, limit=3, mask_topk=(0, 1), mask_control="random")
    sinks = [r["outcome"] for r in runs["k1"]]
    assert all(o["flip"] == 1.0 and o["similarity"] < 1.0 and o["kl"] > 1.0 for o in sinks), sinks
    control = [r["outcome"] for r in runs["k1-random"]]
    assert sum(o["kl"] for o in control) < sum(o["kl"] for o in sinks) / 3
    md = (tmp_path / "summary.md").read_text()
    assert "Outcomes against the unmasked output" in md and "| arith | K=1 (ε0) | sim " in md, md
    deferred = [o["deferred"] for o in sinks]
    assert all(0 <= d <= 1 for d in deferred) and "; deferred " in md and "Δp " in md
    rows = {r["row"]: r for r in csv.DictReader((tmp_path / "summary.csv").open())}
    k1 = rows["K=1 (ε0)"]
    assert float(k1["flip"]) == 1.0 and int(k1["n_outcome"]) == 3
    mean = sum(o["kl"] for o in sinks) / 3
    se = math.sqrt(sum((o["kl"] - mean) ** 2 for o in sinks) / 2 / 3)
    assert float(k1["kl"]) == pytest.approx(mean) and float(k1["kl_se"]) == pytest.approx(se)
    assert rows["Unmasked"]["n_outcome"] == ""                                     # nothing to compare


@pytest.mark.slow
def test_resume_and_a_masked_run_done_before_the_unmasked_one(tmp_path):
    """A masked run without K = 0 stores no outcome; the summary compares it once K = 0 exists
    (KL n/a: no log-probs were kept for it). Growing --limit resumes and adds the new sample's outcome."""
    first = _run("tiny-dlm", tmp_path, limit=2, mask_topk=(1,))
    assert all("outcome" not in r for r in first["k1"])
    _run("tiny-dlm", tmp_path, limit=2, mask_topk=(0,))
    rows = {r["row"]: r for r in csv.DictReader((tmp_path / "summary.csv").open())}
    assert int(rows["K=1 (ε0)"]["n_outcome"]) == 2 and rows["K=1 (ε0)"]["kl"] == "nan"
    again = _run("tiny-dlm", tmp_path, limit=3, mask_topk=(0, 1))
    assert [("outcome" in r) for r in again["k1"]] == [False, False, True]       # done samples kept as they were
    assert again["k1"][2]["outcome"]["kl"] is not None
    assert "KL n/a" not in (tmp_path / "summary.md").read_text()                   # one sample has a KL


def test_a_failed_log_prob_write_is_the_runs_write_error(tmp_path, monkeypatch):
    """Disk full while keeping the unmasked log-probs: the eval's WriteError (kept samples named by
    the runner), no temporary file left behind."""
    def full(obj, path):
        open(path, "wb").write(b"x")
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(torch, "save", full)
    with pytest.raises(records.WriteError, match="No space left"):
        outcomes.save_top(str(tmp_path), 0, {})
    assert list((tmp_path / "commit_logp").iterdir()) == []


@pytest.mark.slow
def test_headline_json_carries_the_readouts(tmp_path):
    """`eval --json` / `replicate --json` read `headline`: the readouts with their SEs, null where none."""
    import json

    from sinklens.eval.summary import headline
    _run("tiny-dlm", tmp_path, limit=2, mask_topk=(0, 1))
    k1 = headline(str(tmp_path / "tiny-dlm" / "arith" / "k1"))
    assert k1["n_outcome"] == 2 and 0 <= k1["similarity"] <= 1 and k1["kl_se"] is not None
    k0 = headline(str(tmp_path / "tiny-dlm" / "arith" / "k0"))
    assert "similarity" not in k0
    json.dumps(k1, allow_nan=False)


@pytest.mark.slow
def test_the_unmasked_row_heads_the_table_of_two_protocols(tmp_path):
    """`sinklens replicate` runs the unmasked baseline once, under the first protocol's folder: the
    table shows it first and without that protocol's name (it is every protocol's baseline)."""
    from sinklens.eval.summary import write_summary
    dirs = []
    for protocol, ks in (("topk", (0, 1)), ("eq3", (1,))):
        dirs.append(str(tmp_path / protocol))
        run_eval(EvalConfig(model="tiny-dlm", task="arith", out=dirs[-1], mask_topk=ks, limit=2, shots=0,
                            dtype="float32", mask_sinks=protocol, loglik=False, progress=False))
    md, _ = write_summary(dirs, str(tmp_path))
    table = md.split("\n\n", 1)[0].splitlines()[2:]     # Table 1 (the outcomes table follows)
    rows = [line.split(" | ")[1] for line in table]
    assert rows[0] == "Unmasked", rows
    assert sorted(rows[1:]) == ["K=1 (ε0), sinks=eq3", "K=1 (ε0), sinks=topk"], rows
