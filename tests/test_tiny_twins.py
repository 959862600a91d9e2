"""Smoke checks of the shipped tiny twins (sinklens/assets/tiny-dlm, tiny-arm).

Small and honest: load through `sinklens.load` (the same path as real checkpoints), run the
real samplers, and compare with answers computed by Python on fixed held-out problems of both
kinds (number combinations never seen in training; wordings and combinations never seen) and on
problems worded here, in sentences that are no template of the training data. Full held-out
accuracies (n = 500 per kind): docs/training.md.
"""
import json
import re
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import sinklens
from sinklens.train.batch import decode_answers, encode_prompts, parse_answer
from sinklens.eval.arith import gen_length, heldout_problems
from sinklens.experiments.twins import LOAD, arm_sampler, dlm_sampler
from sinklens.train.model import ModelConfig, build_model, llada_name

ASSETS = Path(sinklens.__file__).parent / "assets"
N_PROBLEMS = 12


# Problems worded for this test, not by the training templates (sinklens/train/wordings.py):
# other names, objects, verbs and sentence shapes. (question, answer by hand, checked below)
OWN_WORDINGS = [
    ("Jake has 12 marbles. His friend gives him 7 more marbles. How many marbles does Jake have now?", 19),
    ("A farmer has 41 cows. He buys 16 more cows. How many cows does the farmer have?", 57),
    ("Tom has 18 pens. Ana gives Tom 25 pens. How many pens does Tom have now?", 43),
    ("Sam had 9 books. He got 40 more books for his birthday. How many books does he have now?", 49),
    ("Ben has 16 cards. His sister gives him 33 cards. How many cards does Ben have?", 49),
    ("Zoe has 28 toys. She gets 19 more toys. How many toys does Zoe have altogether?", 47),
    ("Jake has 45 marbles. He loses 17 of them. How many marbles does Jake have now?", 28),
    ("A farmer has 50 cows. He sells 23 cows. How many cows does the farmer have left?", 27),
    ("Tom has 33 pens. He gives 8 pens to Ana. How many pens does Tom have now?", 25),
    ("Lily had 47 candies. She ate 19 candies. How many candies are left?", 28),
    ("Max has 29 coins. He spends 11 coins. How many coins does he have left?", 18),
    ("Zoe has 37 beads. She drops 18 beads. How many beads does she still have?", 19),
]


def _solve(name, sampler, questions=None, answers=None, split="heldout"):
    m = sinklens.load(name, **LOAD)
    if questions is None:
        problems = heldout_problems(N_PROBLEMS, split=split)
        questions, answers = [p.question for p in problems], [p.answer for p in problems]
    ids, am = encode_prompts(m.tokenizer, questions)
    torch.manual_seed(0)
    out = m.generate(ids, attention_mask=am, **sampler)
    texts = decode_answers(m.tokenizer, out.sequences[:, ids.shape[1]:])
    return m, sum(parse_answer(t) == a for a, t in zip(answers, texts)), texts


@pytest.mark.parametrize("name", ["tiny-dlm", "tiny-arm"])
def test_shipped_folder_is_small_fp16_safetensors(name):
    folder = ASSETS / name
    assert sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()) <= 25 * 2**20
    weights = load_file(str(folder / "model.safetensors"))
    assert {v.dtype for v in weights.values()} == {torch.float16}
    assert (folder / "training" / "command.txt").read_text().strip()


@pytest.mark.parametrize("split", ["heldout", "heldout-wording"])
def test_tiny_dlm_solves_heldout_problems(split):
    """The shipped DLM (LLaDA's objective, its own sampler): held-out exact 0.960 / 0.944, n = 500 per
    kind (docs/training.md); on these 12, at most 2 misses (12 and 11 when measured)."""
    m, correct, texts = _solve("tiny-dlm", dlm_sampler(), split=split)
    assert m.is_diffusion and m.family.name == "llada" and m.mask_id == m.tokenizer.mask_token_id
    assert correct >= N_PROBLEMS - 2, texts


@pytest.mark.parametrize("split", ["heldout", "heldout-wording"])
def test_tiny_arm_solves_heldout_problems(split):
    """Held-out exact >= 0.97 on 500 problems of each kind (docs/training.md): on 12, at most 2 misses."""
    m, correct, texts = _solve("tiny-arm", arm_sampler(), split=split)
    assert not m.is_diffusion
    assert correct >= N_PROBLEMS - 2, texts


@pytest.mark.parametrize("name", ["tiny-arm", "tiny-dlm"])
def test_own_wordings_are_worded_outside_the_templates_and_answered_right(name):
    """Most problems worded here, outside the training templates, get the right answer from the ARM
    and the DLM twin (docs/training.md: "Own wordings": 10 and 9 of these 12 when measured)."""
    for q, a in OWN_WORDINGS:
        nums = [int(x) for x in re.findall(r"\d+", q)]
        assert a in (nums[0] + nums[1], nums[0] - nums[1])
    questions, answers = [q for q, _ in OWN_WORDINGS], [a for _, a in OWN_WORDINGS]
    _, correct, texts = _solve(name, arm_sampler() if name == "tiny-arm" else dlm_sampler(), questions, answers)
    assert correct >= {"tiny-arm": 8, "tiny-dlm": 7}[name], texts


@pytest.mark.parametrize("mode", ["ar", "diffusion"])
def test_own_wordings_answered_by_tiny_dual_in_each_mode(mode):
    """The same problems, worded outside the templates, from tiny-dual's one set of weights: most
    answered right in each mode (docs/replicate/dual.md: AR 10 / 12, block diffusion 8 / 12 when measured)."""
    from sinklens.experiments.twins import dual_sampler

    m = sinklens.load("tiny-dual", mode=mode, **LOAD)
    sampler = arm_sampler() if mode == "ar" else dual_sampler()
    correct = 0
    for q, a in OWN_WORDINGS:                     # one prompt at a time: SDAR's sampler takes no batch
        ids = torch.tensor([m.apply_chat_template(q)])
        out = m.generate(ids, **sampler)
        correct += parse_answer(m.tokenizer.decode(out.sequences[0, ids.shape[1]:], skip_special_tokens=True)) == a
    assert correct >= (8 if mode == "ar" else 7), correct


def test_tiny_dlm_loader_logits_equal_training_architecture():
    """sinklens.load's key_mapping and our export's name map are independent; logits must agree."""
    folder = ASSETS / "tiny-dlm"
    conf = json.loads((folder / "config.json").read_text())
    cfg = ModelConfig(n_layers=conf["n_layers"], d_model=conf["d_model"], n_heads=conf["n_heads"],
                      mlp_hidden=conf["mlp_hidden_size"], vocab_size=conf["vocab_size"])
    ours = build_model(cfg, diffusion=True, seed=0).eval()
    official = load_file(str(folder / "model.safetensors"))
    ours.load_state_dict({k: official[llada_name(k)].float() for k in ours.state_dict()})
    m = sinklens.load("tiny-dlm", **LOAD)
    ids, am = encode_prompts(m.tokenizer, [p.question for p in heldout_problems(3, seed=1)])
    G = gen_length()
    x = torch.cat([ids, torch.full((3, G), m.mask_id)], 1)
    a = torch.cat([am, torch.ones((3, G), dtype=am.dtype)], 1)
    with torch.no_grad():
        want = ours(input_ids=x, attention_mask=a).logits
    got = m.forward_logits(x, attention_mask=a)
    torch.testing.assert_close(got[a.bool()], want[a.bool()], atol=1e-4, rtol=1e-4)


@pytest.mark.slow
def test_replicate_writes_table_and_dynamics(tmp_path):
    """`sinklens replicate` end to end on 2 problems: Table-1 rows for both twins + a report."""
    from sinklens.eval.summary import find_runs, summarize_run
    from sinklens.experiments.replicate import replicate
    res = replicate(tmp_path, n=2, mask_topk=(0, 1), progress=False, n_traces=3)
    runs = find_runs([str(tmp_path / "eval")])
    rows = [(summarize_run(r), Path(r).name, Path(r).parts[-4]) for r in runs]      # .../eval/<protocol>/<model>/arith/kK
    # both protocols, one shared unmasked run; every masked row has its random-key control beside it
    models = ("tiny-arm", "tiny-dlm", "tiny-dual (ar)", "tiny-dual (diffusion)")   # the four of the matched table
    assert sorted((proto, r["model"], r["mask_topk"], name, r["n"]) for r, name, proto in rows) == sorted(
        [(proto, m, 1, k, 2) for proto in ("eq3", "topk") for m in models for k in ("k1", "k1-random")]
        + [("topk", m, 0, "k0", 2) for m in models])
    for r, name, proto in rows:
        recs = [json.loads(line) for line in open(Path(r["run_dir"]) / "samples.jsonl")]
        for rec in recs:                       # what was blocked is recorded per sample
            if name == "k1-random" and rec["masked"]["blocked_entries"]:
                assert rec["masked"]["eq3_sink_share"] == 0.0
            if name == "k1" and rec["masked"]["blocked_entries"]:
                assert "category_share" in rec["masked"]
                if proto == "eq3":             # the stricter protocol blocks Eq. 3 sinks only
                    assert rec["masked"]["eq3_sink_share"] == 1.0
    table = res["summary_md"]                     # the Table 1 markdown of both protocols
    assert "sinks=topk" in table and "sinks=eq3" in table
    assert "; deferred " in table and "Δp " in table   # §5.2 beside the outcome readouts (the diffusion models)
    assert Path(res["report"]).is_file() and Path(res["persistence_md"]).is_file()
    dyn = {(r["model"], r["units"]): r for r in res["rows"]}
    assert set(dyn) == {("tiny-dlm", "scaled_sum"), ("tiny-arm", "scaled_sum"), ("tiny-arm", "uniform_ratio"),
                        ("tiny-dual (ar)", "scaled_sum"), ("tiny-dual (ar)", "uniform_ratio"),
                        ("tiny-dual (diffusion)", "scaled_sum")}      # causal models: also relative to uniform
    for r in dyn.values():
        assert r["problems"] == 3 and len(r["sinks_per_head_and_step_by_layer"]) == 4
        if r["sink_occurrences"]:
            assert abs(sum(r["sink_token_categories"].values()) - 1) < 1e-9
    assert dyn[("tiny-dlm", "scaled_sum")]["consecutive_sink_pairs"] > 0
    dyn_md = Path(res["dynamics_md"]).read_text()
    assert dyn_md.count("| tiny-") == 12 and "Tracks (a sink followed" in dyn_md     # 6 rows in each of 2 tables


@pytest.mark.parametrize("name", ["tiny-dlm", "tiny-arm"])
def test_trace_reads_back_what_the_capture_recorded(tmp_path, name):
    """What a traced twin generation writes reads back, step by step and column by column, as what
    the sampler handed over at that step (float16 rounding for the attention): the canvas, mask
    state, revealed and real positions, the query rows, received (which the file leaves out where
    the masked / unmasked groups sum to it), the groups. The writer holds a sampler's steps and
    converts them a group at a time (here groups of 5 steps, a batch of 2 left-padded prompts): its
    file holds what `write_step` writes from each step converted at once. And the traced tokens are
    the untraced ones."""
    import numpy as np
    import pyarrow as pa

    from sinklens.trace.writer import TraceWriter, event_arrays

    class Keep:
        wants_attention = True

        def __init__(self, path):
            self.steps = []
            self.each = TraceWriter(path, {})  # the same steps, each converted and written as it ends

        def after_step(self, e):
            groups = e.attention.received_groups
            self.steps.append(dict(
                tokens=e.tokens.clone(), is_masked=e.is_masked.clone(), revealed=e.revealed.clone(),
                attention_mask=e.attention_mask.clone(), received=e.attention.received.clone(),
                groups=None if groups is None else groups.clone(),
                query_positions=None if e.query_positions is None else [q.clone() for q in e.query_positions]))
            self.each.write_step(e.step, **event_arrays(e))

    m = sinklens.load(name, **LOAD)
    sampler = dlm_sampler() if m.is_diffusion else arm_sampler()
    questions = [p.question for p in heldout_problems(N_PROBLEMS)]
    short, long = min(questions, key=len), max(questions, key=len)
    ids, am = encode_prompts(m.tokenizer, [short, long])
    assert not am.all()  # left padding: the real positions differ from row to row
    keep = Keep(tmp_path / "each.arrow")
    path = tmp_path / "t.arrow"
    writer = TraceWriter(path, flush_steps=5, flush_seconds=3600)
    traced = m.generate(ids, attention_mask=am, trace=writer, hook=keep, **sampler)
    writer.close()
    keep.each.close()
    assert torch.equal(traced.sequences, m.generate(ids, attention_mask=am, **sampler).sequences)
    t = sinklens.open_trace(path)
    assert t.steps == list(range(len(keep.steps)))
    with pa.OSFile(str(path), "rb") as f:  # a record batch per group of 5 steps
        assert sum(1 for _ in pa.ipc.open_stream(f)) == -(-len(keep.steps) // 5)
    mine, each = t.table(), sinklens.open_trace(keep.each.path).table()
    nan_cols = [c for c in ("commit_prob",) if c in mine.column_names]     # NaN where nothing was committed
    assert mine.drop_columns(nan_cols).equals(each.drop_columns(nan_cols))
    for c in nan_cols:                                                     # NaN != NaN to pyarrow: compare as arrays
        np.testing.assert_array_equal(np.concatenate([np.asarray(x or [], np.float32).ravel() for x in mine.column(c).to_pylist()]),
                                      np.concatenate([np.asarray(x or [], np.float32).ravel() for x in each.column(c).to_pylist()]))
    f16 = lambda x: x.half().float().numpy()  # noqa: E731
    for step, kept in enumerate(keep.steps):
        for row in range(2):
            for column in ("tokens", "is_masked", "revealed", "attention_mask"):
                np.testing.assert_array_equal(getattr(t, column)(step, row), kept[column][row].numpy())
            rows = kept["query_positions"]
            np.testing.assert_array_equal(t.query_positions(step, row), np.flatnonzero(kept["attention_mask"][row])
                                          if rows is None else rows[row].numpy())
            np.testing.assert_allclose(t.received(step, row), kept["received"][:, row].numpy(), rtol=2e-3, atol=2e-3)
            if kept["groups"] is not None:
                np.testing.assert_array_equal(t.received_groups(step, row), f16(kept["groups"][:, row].transpose(0, 1)))
    if m.is_diffusion:  # the split covers every row: received is not stored, the reader sums the groups
        table = t.table()
        assert table.column("received").null_count == table.num_rows


@pytest.mark.slow
def test_score_script_answers_a_mistake_in_one_line():
    """docs/training.md's `python -m sinklens.experiments.score MODEL`: a typo'd name or a bad
    setting is one line and exit status 2, not a traceback."""
    import os
    import subprocess
    import sys

    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    for args, expected in ((["tiny-dln"], "'tiny-dln' is neither an alias"),
                           (["tiny-dlm", "--n", "0"], "--n must be a positive integer"),
                           (["tiny-dlm", "--n", "2", "--block-length", "5"], "must be a multiple of block_length")):
        res = subprocess.run([sys.executable, "-m", "sinklens.experiments.score", *args], env=env,
                             capture_output=True, text=True, timeout=300)
        last = res.stderr.strip().splitlines()[-1]
        assert res.returncode == 2 and "Traceback" not in res.stderr and expected in last, res.stderr


def test_replicate_models_are_the_matched_labels(tmp_path):
    """`replicate --models` takes some of the four matched models by label; anything else is one line."""
    from sinklens.cli import main
    from sinklens.experiments.replicate import model_labels, replicate

    assert model_labels() == ["tiny-arm", "tiny-dlm", "tiny-dual (ar)", "tiny-dual (diffusion)"]
    with pytest.raises(ValueError, match="models must be some of"):
        replicate(tmp_path, n=1, models=("tiny-dual",))
    with pytest.raises(SystemExit) as e:
        main(["replicate", "--out", str(tmp_path), "--models", "tiny-arm,nope"])
    assert e.value.code == 2 and not any(tmp_path.iterdir())


def test_demo_shows_every_shipped_twin_dlm_first():
    """`make demo` traces the DLM twin (the README's figure), the ARM twin and tiny-dual in both of its
    modes, each with the sampler Table 1 runs it with, into files named from the labels."""
    from sinklens.experiments.demo import default_models
    from sinklens.experiments.demo_model import slug
    from sinklens.experiments.twins import matched_models

    models, prompt = default_models()
    assert [m.label for m in models] == ["tiny-dlm", "tiny-arm", "tiny-dual (ar)", "tiny-dual (diffusion)"]
    by_label = {m.label: m for m in matched_models()}
    assert all(m == by_label[m.label] for m in models)
    assert [slug(m.label) for m in models] == ["tiny-dlm", "tiny-arm", "tiny-dual-ar", "tiny-dual-diffusion"]
    assert prompt.strip()


def test_a_masked_arm_trace_reads_the_same_in_one_group_as_a_group_per_step(tmp_path):
    """An ARM's steps grow a key each, so a group's columns cannot be stacked: written in one group, in
    groups of 3 (the second has blocked keys at every step) or a group per step, a traced and
    sink-masked batch of two left-padded prompts reads back the same."""
    from sinklens.masking.config import MaskingConfig
    from sinklens.masking.policy import SinkMaskingPolicy
    from sinklens.trace.writer import TraceWriter

    m = sinklens.load("tiny-arm", **LOAD)
    questions = [p.question for p in heldout_problems(2)]
    ids, am = encode_prompts(m.tokenizer, questions)
    tables = []
    for flush_steps in (1, 3, 64):
        path = tmp_path / f"t{flush_steps}.arrow"
        writer = TraceWriter(path, flush_steps=flush_steps, flush_seconds=3600)
        policy = SinkMaskingPolicy(MaskingConfig(mask_k=1), num_layers=m.num_layers, is_diffusion=False, model=m)
        m.generate(ids, attention_mask=am, trace=writer, hook=policy, **{**arm_sampler(), "max_new_tokens": 6})
        writer.close()
        t = sinklens.open_trace(path)
        assert t.num_steps == 6 and len(t.blocked(3, 1)) == m.num_layers * t.num_heads   # top-1 per (layer, head)
        tables.append(t.table())
    assert tables[0].equals(tables[1]) and tables[0].equals(tables[2])
