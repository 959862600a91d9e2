"""Trace columns as data, and the commit-probability readout (the paper's §5.2 hypothesis).

A new core column is one declaration: a test-only writer subclass adds two columns (one per
position, one per layer and head); they are written from `write_step` keywords and from a step
event's field, validated against the step's shapes, and read back by `Trace.column` and
`read_back` with no other edit. The §5.2 readout is checked on a planted case with a real model:
tiny-dual answers an addition; blocking the keys of the operands (every layer and head), which the
answer's digits depend on, changes the digits it writes, and the readout sees an unsure commit.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
import torch

import sinklens
from sinklens.attention.request import AttentionRequest
from sinklens.columns import Column
from sinklens.samplers.hooks import StepEvent
from sinklens.trace.commits import CommitRecorder, Commits, deferrals
from sinklens.trace.writer import TraceWriter, event_arrays, read_back

L, H, S = 2, 3, 6
SCORE = Column("score", "S", "float32", "a test-only value per position")
HEAT = Column("heat", "LH", "float32", "a test-only value per layer and head")


class WiderWriter(TraceWriter):
    columns = TraceWriter.columns + (SCORE, HEAT)


@dataclass
class WiderEvent(StepEvent):
    score: torch.Tensor | None = None  # (B, S)


def _step(t: int):
    rng = np.random.default_rng(t)
    return dict(tokens=np.arange(S) + t, received=rng.random((1, L, H, S), dtype=np.float32),
                score=np.linspace(0, 1, S, dtype=np.float32) + t, heat=rng.random((1, L, H), dtype=np.float32))


def test_a_new_column_is_one_declaration(tmp_path):
    path = tmp_path / "wide.arrow"
    steps = [_step(t) for t in range(3)]
    with WiderWriter(path, {"family": "test"}) as w:
        for t, arrays in enumerate(steps):
            w.write_step(t, **arrays)
        # the same column from a sampler's step event (a field of its name)
        w.after_step(WiderEvent(step=3, tokens=torch.arange(S)[None], is_masked=torch.zeros(1, S, dtype=torch.bool),
                                revealed=torch.zeros(1, S, dtype=torch.bool), logits=torch.zeros(1, S, 4),
                                attention=None, score=torch.full((1, S), 7.0)))
    t = sinklens.open_trace(path)
    assert t.schema.field("score").metadata[b"shape"] == b"S"
    for step, arrays in enumerate(steps):
        np.testing.assert_array_equal(t.column("score", step), arrays["score"])
        np.testing.assert_array_equal(t.column("heat", step), arrays["heat"][0])       # (L, H) as declared
        back = read_back(arrays, "float16", columns=WiderWriter.columns)
        np.testing.assert_array_equal(back["score"], t.column("score", step))
        np.testing.assert_array_equal(back["heat"], t.column("heat", step))
        np.testing.assert_array_equal(back["received"], t.received(step))
    np.testing.assert_array_equal(t.column("score", 3), np.full(S, 7.0, np.float32))
    assert t.column("heat", 3) is None                                                  # not given: a null cell
    assert event_arrays(WiderEvent(step=0, tokens=None, is_masked=None, revealed=None, logits=None, attention=None,
                                   score=5), WiderWriter.columns)["score"] == 5
    # a plain writer has no such column and says which ones it has
    with TraceWriter(tmp_path / "plain.arrow") as w, pytest.raises(TypeError, match="unknown column.*score"):
        w.write_step(0, **steps[0])


def test_a_declared_column_is_checked_against_the_steps_shapes(tmp_path):
    with WiderWriter(tmp_path / "w.arrow") as w:
        bad = dict(_step(0), heat=np.zeros((1, L, H + 1), np.float32))
        with pytest.raises(ValueError, match=r"heat must have shape \(B, L, H\) = \(1, 2, 3\)"):
            w.write_step(0, **bad)
        with pytest.raises(ValueError, match=r"score must have shape \(B, S\) = \(1, 6\)"):
            w.write_step(0, **dict(_step(0), score=np.zeros(S + 1, np.float32)))
        w.write_step(0, **_step(0))
        with pytest.raises(ValueError, match="received must have shape"):  # L and H are the trace's from now on
            w.write_step(1, **dict(_step(1), received=np.zeros((1, L + 1, H, S), np.float32)))


def test_commit_probabilities_and_deferrals_by_hand():
    from sinklens.samplers.steps import commit_probabilities

    logits = torch.log(torch.tensor([[[0.7, 0.2, 0.1], [0.1, 0.6, 0.3], [0.5, 0.25, 0.25]]]))  # (1, 3 rows, V=3)
    revealed = torch.tensor([[False, True, True, False]])                                    # positions 1, 2
    chosen = torch.tensor([[0, 2, 1, 0]])
    # rows are positions 1..3 (query_positions start at 1): position 1 -> row 0, position 2 -> row 1
    p = commit_probabilities(logits, revealed, chosen, query_positions=[torch.arange(1, 4)])
    np.testing.assert_allclose(p[0, 1:3].numpy(), [0.1, 0.6], rtol=1e-6)
    assert torch.isnan(p[0, [0, 3]]).all()
    assert commit_probabilities(logits, torch.zeros(1, 4, dtype=torch.bool), chosen) is None

    a, b = Commits.empty(5), Commits.empty(5)
    for step, rev in enumerate([[0, 0, 1, 1, 0], [0, 0, 0, 0, 1]]):
        a.add(step, np.array(rev, bool), np.full(5, 0.9))
    for step, rev in enumerate([[0, 0, 1, 0, 1], [0, 0, 0, 0, 0], [0, 0, 0, 1, 0]]):
        b.add(step, np.array(rev, bool), np.full(5, 0.5))
    d = deferrals(a, b)
    assert (d.commits, d.deferred, d.advanced, d.same) == (3, 1, 1, 1)  # 3 later, 4 earlier, 2 the same
    assert d.per_step == {0: (2, 1), 1: (1, 0)} and (d.prob_unmasked, d.prob_masked) == pytest.approx((0.9, 0.5))


class BlockKeys:
    """A step hook that blocks the same keys in every layer and head (a planted mask)."""

    def __init__(self, positions, num_layers, num_heads):
        self.positions, self.shape = list(positions), (num_layers, num_heads)

    def before_step(self, step, tokens, is_masked):
        blocked = torch.zeros(self.shape[0], tokens.shape[0], self.shape[1], tokens.shape[1], dtype=torch.bool)
        blocked[..., self.positions] = True
        return AttentionRequest(blocked=blocked)


def test_masking_the_keys_an_answer_depends_on_changes_it_and_the_commit_readout_sees_it(tmp_path):
    """Planted: tiny-dual (block diffusion, SDAR's sampler) answers "Max has 29 cards. He finds 22 more.
    How many cards now?" with "29+22=51. #### 51": it copies the operands from the prompt, each committed
    with probability > 0.99. Blocking every prompt key that holds a digit (every layer and head) takes away
    what the copied digits depend on: the operands it writes change, and the run commits at least one
    answer token it is unsure of (< 0.9), so the readout's mean over the unmasked run's commits drops.
    (Whether masking lowers the confidence of *every* dependent token is what §5.2 asks, not a property:
    here the model writes other operands confidently. The dual's sequential sampler commits left to
    right, so a masked run defers nothing; `deferrals` is checked on its counts.)"""
    m = sinklens.load("tiny-dual", dtype="float32")
    ids = torch.tensor([m.apply_chat_template("Max has 29 cards. He finds 22 more. How many cards now?")])
    P = ids.shape[1]
    digits = [i for i, t in enumerate(m.tokenizer.convert_ids_to_tokens(ids[0].tolist())) if any(c.isdigit() for c in t)]
    assert len(digits) == 4, "the prompt holds two two-digit operands"
    plain = m.generate(ids, trace=str(tmp_path / "plain.arrow"))
    recorder = CommitRecorder()
    masked = m.generate(ids, trace=str(tmp_path / "masked.arrow"),
                        hook=[BlockKeys(digits, m.num_layers, m.num_heads), recorder])
    a = Commits.from_trace(sinklens.open_trace(tmp_path / "plain.arrow"))
    b = Commits.from_trace(sinklens.open_trace(tmp_path / "masked.arrow"))
    np.testing.assert_array_equal(b.step, recorder.rows[0].step)          # a hook gets what the trace holds
    np.testing.assert_array_equal(b.prob, recorder.rows[0].prob)
    committed = a.step >= 0
    assert ((a.prob[committed] > 0) & (a.prob[committed] <= 1)).all()
    answer = m.tokenizer.convert_ids_to_tokens(plain.sequences[0, P:].tolist())
    assert "".join(answer).startswith("29+22="), answer                  # the case as planted
    copied = np.array([P + j for j, t in enumerate(answer[:answer.index("=")]) if t.isdigit()])  # 29, 22
    assert len(copied) == 4 and (a.prob[copied] > 0.99).all() and a.prob[P:P + 6].min() > 0.99
    masked_answer = m.tokenizer.convert_ids_to_tokens(masked.sequences[0, P:].tolist())
    assert [masked_answer[j - P] for j in copied] != [answer[j - P] for j in copied], masked_answer   # it depended on them
    assert b.prob[P:P + 6].min() < 0.9                                    # an unsure commit where none was
    d = deferrals(a, b)
    assert d.commits == int(committed.sum()) and d.same + d.deferred + d.advanced == d.commits
    assert d.prob_masked < d.prob_unmasked and deferrals(a, a).deferred == 0


def test_the_report_reads_commit_confidence_from_a_trace_and_a_corpus_stream_folds_it_alike(tmp_path):
    """analyze() keeps per step the mean probability of the committed tokens (the `commit_prob`
    column, by hand here); the Summary names it; a step without commits is NaN with count 0; a
    trace without the column (an ARM's) has none. The corpus part is its sum and count."""
    from sinklens.analysis.analyze import analyze
    from sinklens.analysis.commits import CommitConfidence

    m = sinklens.load("tiny-dual", dtype="float32")
    ids = torch.tensor([m.apply_chat_template("Max has 29 cards. He finds 22 more. How many cards now?")])
    m.generate(ids, trace=str(tmp_path / "d.arrow"))
    t = sinklens.open_trace(tmp_path / "d.arrow")
    probs = [t.commit_prob(s) for s in t.steps]
    want = [np.nanmean(p) if p is not None and np.isfinite(p).any() else np.nan for p in probs]
    a = analyze(str(tmp_path / "d.arrow"))
    cc = a.commit_confidence
    np.testing.assert_allclose(cc.mean, want, rtol=1e-6)
    assert cc.count.tolist() == [0 if p is None else int(np.isfinite(p).sum()) for p in probs]
    assert cc.count.sum() > 0 and 0 < cc.overall() <= 1
    rows = dict(a.summary_rows())
    assert rows["commit confidence (§5.2)"].startswith("mean probability ")
    part = CommitConfidence.corpus(cc, t.num_steps)["commit_confidence"]
    assert part["n"] == cc.count.sum() and part["sum"] / part["n"] == pytest.approx(cc.overall(), rel=1e-6)
    arm = sinklens.load("tiny-dual", mode="ar", dtype="float32")
    arm.generate(ids, trace=str(tmp_path / "a.arrow"), max_new_tokens=4)
    b = analyze(str(tmp_path / "a.arrow"))
    assert b.commit_confidence is None and b.to_dict()["commit_confidence"] is None     # an ARM records none
    assert "commit confidence (§5.2)" not in dict(b.summary_rows())


def test_commit_probabilities_reach_every_hook_unless_all_hooks_decline_them():
    """A hook gets `event.commit_prob` unless every hook of the run says it never reads it
    (`wants_commit_prob = False`, as the masking policy): then the step skips making it."""
    from sinklens.masking.config import MaskingConfig
    from sinklens.masking.policy import SinkMaskingPolicy

    m = sinklens.load("tiny-dlm", dtype="float32")
    ids = torch.tensor([m.apply_chat_template("Max has 29 cards. He finds 22 more. How many cards now?")])

    class Seen:
        def __init__(self, wants: bool | None):
            self.probs = []
            if wants is not None:
                self.wants_commit_prob = wants

        def after_step(self, event):
            self.probs.append(event.commit_prob)

    plain = m.generate(ids, steps=8, gen_length=8, block_length=8)
    for hooks, made in (([Seen(None)], True), ([Seen(False)], False), ([Seen(False), Seen(None)], True),
                        ([Seen(False), SinkMaskingPolicy(MaskingConfig(mask_k=1), num_layers=m.num_layers)], False)):
        out = m.generate(ids, steps=8, gen_length=8, block_length=8, hook=hooks)
        assert torch.equal(out.sequences, plain.sequences) or isinstance(hooks[-1], SinkMaskingPolicy)
        probs = hooks[0].probs
        assert len(probs) == 8
        if made:
            assert all(p is not None and torch.isfinite(p).sum() == 1 for p in probs)  # one token per step
        else:
            assert all(p is None for p in probs)


@pytest.mark.parametrize("settings", [{}, {"cfg_scale": 1.0}, {"temperature": 0.7}, {"remasking": "random"}],
                         ids=["greedy", "cfg", "sampled", "random-remasking"])
def test_a_samplers_own_probabilities_are_the_commit_probabilities_of_its_logits(settings):
    """LLaDA's low-confidence remasking hands the step the probabilities it ranked on (`probs`):
    commit_prob is then read from them, not made again. Whatever the settings, it is what
    `commit_probabilities` makes from the step's logits and committed tokens (up to float32
    rounding; NaN at the same places), and None at no step that commits."""
    from sinklens.samplers.steps import commit_probabilities

    m = sinklens.load("tiny-dlm", dtype="float32")
    ids = torch.tensor([m.apply_chat_template("Max has 29 cards. He finds 22 more. How many cards now?")])

    class Seen:
        def __init__(self):
            self.events = []

        def after_step(self, event):
            self.events.append((event.logits.clone(), event.revealed.clone(), event.commit_prob))

    seen = Seen()
    torch.manual_seed(0)
    out = m.generate(ids, steps=8, gen_length=8, block_length=8, hook=seen, **settings)
    assert len(seen.events) == 8
    for logits, revealed, prob in seen.events:
        want = commit_probabilities(logits, revealed, out.sequences)   # committed tokens are never changed later
        assert prob is not None and want is not None
        assert torch.equal(prob.isnan(), want.isnan()) and int((~prob.isnan()).sum()) == 1
        torch.testing.assert_close(prob, want, rtol=1e-5, atol=1e-7, equal_nan=True)


def test_an_arm_step_reveals_nothing_in_the_canvas_fed_so_has_no_commit_probabilities():
    """The ARM sampler tells the step it commits nothing (`commits=False`: its token is appended
    after the canvas fed), so no commit_prob is made; that holds because its `revealed` is empty at
    every step, which this checks, with a hook that wants the probabilities."""
    m = sinklens.load("tiny-arm", dtype="float32")
    ids = torch.tensor([m.apply_chat_template("Max has 29 cards. He finds 22 more. How many cards now?")])
    seen = []
    out = m.generate(ids, max_new_tokens=6, eos_token_id=[],
                     hook=lambda event: seen.append((event.revealed.clone(), event.commit_prob)))
    assert out.num_steps == len(seen) == 6
    assert all(not revealed.any() and prob is None for revealed, prob in seen)
