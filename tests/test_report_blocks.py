"""The report on block diffusion and editing (issue 20, item 5): block boundaries on the figures,
sinks across blocks, the uniform baseline under block-causal attention, sinks on edited tokens,
and one compare report of a LLaDA2-format, an SDAR-format and a LLaDA trace.

Ground truth comes from outside the report code: the traces' own columns (the sampler's query
rows, its `edited` flags), the block sizes passed to the samplers / SDAR's config.json, Eq. 3 and
the uniform expectation recomputed here by brute force (a dense visibility matrix), and the
planted trace's written-down sinks (tests/_planted.py)."""
from __future__ import annotations

import json

import numpy as np
import pytest

import _block_traces as B
import _planted as P
import sinklens
from sinklens.analysis import analyze
from sinklens.analysis.blocks import block_dynamics, edited_sinks
from sinklens.cli import main
from sinklens.report import figures as F
from sinklens.trace import TraceWriter


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    return B.make(tmp_path_factory.mktemp("block_traces"))


def _eq3_sinks(r: np.ndarray, scale: float, eps: float = 3.0) -> np.ndarray:
    """(L, H, S) bool: Eq. 3 on scaled column sums, every key visible (the step's keys all are)."""
    s = r * scale
    K = s.shape[-1]
    return s - (s.sum(-1, keepdims=True) - s) / (K - 1) >= eps


@pytest.mark.slow
def test_block_boundaries_on_fig1_fig7_and_maps(traces, tmp_path):
    for name, size in (("sdar", B.SDAR_BLOCK), ("llada21", B.LLADA2_BLOCK)):
        a = analyze(traces[name])
        S = a.tokens.shape[1]
        want = [p - 0.5 for p in range(size, S, size)]
        fig1 = F.received_over_steps(a)
        got = sorted(l.get_xdata()[0] for l in fig1.axes[0].get_lines() if l.get_linestyle() == ":")
        assert got == want, name
        assert any("attention block" in t.get_text() for t in fig1.legends[0].get_texts())
        fig7 = F.sink_positions(a)
        assert sorted(l.get_ydata()[0] for l in fig7.axes[0].get_lines() if l.get_linestyle() == ":") == want
        fig1.savefig(tmp_path / f"{name}_fig1.png", dpi=110)
        fig7.savefig(tmp_path / f"{name}_fig7.png", dpi=110)
    a = analyze(traces["llada21"])
    fig4 = F.attention_maps(a, [0, a.num_steps - 1], 0, 0)
    for ax, t in zip(fig4.axes, (0, a.num_steps - 1)):
        n = int(a.seq_len[t])
        assert sorted(l.get_xdata()[0] for l in ax.get_lines() if l.get_linestyle() == ":") == \
               [p - 0.5 for p in range(B.LLADA2_BLOCK, n, B.LLADA2_BLOCK)]
    fig4.savefig(tmp_path / "llada21_fig4.png", dpi=110)
    plain = analyze(P.source())                     # LLaDA's generation blocks: after the prompt
    fig1 = F.received_over_steps(plain, 0, 1)
    assert sorted(l.get_xdata()[0] for l in fig1.axes[0].get_lines() if l.get_linestyle() == ":") == \
           [p - 0.5 for p in range(P.PROMPT, P.S, P.BLOCK)]


def test_sinks_across_blocks_match_a_recount_from_the_trace(traces, tmp_path):
    """SDAR: the block a step denoises is the block of its query rows (the sampler's record); the
    sinks at each block's last step are Eq. 3 recomputed here from the received column sums."""
    t = sinklens.open_trace(traces["sdar"])
    prompt = t.meta["layout"]["prompt_length"]
    last: dict[int, tuple[int, set]] = {}
    for i, step in enumerate(t.steps):
        q = t.query_positions(step)
        block = int(q.max()) // B.SDAR_BLOCK
        assert int(q.min()) // B.SDAR_BLOCK == block               # queries = one block (the active one)
        r = t.received(step)                                        # (L, H, S): keys = cache + block
        sinks = _eq3_sinks(r, r.shape[-1] / len(q))                 # scaled_sum: r · K / Q
        last[block] = (i, {(int(l), int(h), int(p)) for l, h, p in zip(*np.nonzero(sinks))})
    blocks = sorted(last)
    d = block_dynamics(analyze(traces["sdar"]))
    assert d.blocks == blocks and d.last_step == [last[b][0] for b in blocks]
    sets = [last[b][1] for b in blocks]
    assert d.sinks == sets
    assert d.persist == [len(x & y) for x, y in zip(sets, sets[1:])]
    assert d.new == [len(y - x) for x, y in zip(sets, sets[1:])]
    assert d.gone == [len(x - y) for x, y in zip(sets, sets[1:])]
    assert [p + e + o for p, e, o in zip(d.in_prompt, d.in_earlier, d.in_own)] == [len(s) for s in sets]
    assert d.in_prompt == [sum(p < prompt for _, _, p in s) for s in sets]
    assert sum(map(len, sets)) > 0                                  # the run has sinks to follow
    fig = F.block_sinks(analyze(traces["sdar"]))
    bars = [p.get_height() for p in fig.axes[1].patches]
    assert sorted(bars) == sorted(d.persist + d.new + d.gone)
    fig.savefig(tmp_path / "sdar_fig11.png", dpi=110)


def test_uniform_baseline_under_block_causal_attention(traces):
    """uniform_ratio on a LLaDA2 window step: r_j divided by what uniform attention over the keys
    each query may see (its own and earlier blocks) gives key j — a dense mask summed here."""
    a = analyze(traces["llada21"], units="uniform_ratio")
    t = sinklens.open_trace(traces["llada21"])
    for i in (0, a.num_steps // 2, a.num_steps - 1):
        step = t.steps[i]
        r = t.received(step)                                        # (L, H, S)
        S = r.shape[-1]
        q = t.query_positions(step)
        block = np.arange(S) // B.LLADA2_BLOCK
        sees = block[None, :] <= block[q][:, None]                  # (Q, S) block-causal visibility
        expected = (sees / sees.sum(1, keepdims=True)).sum(0)       # (S,) column sums of uniform attention
        np.testing.assert_allclose(a.step_scores(i), r / expected, rtol=1e-4)
    early = expected[: B.LLADA2_BLOCK].mean() / expected[-B.LLADA2_BLOCK:].mean()
    assert early > 1.5                                              # earlier blocks: seen by more queries


def _write_planted_with_edits(path, edits: dict[int, list[int]]):
    """The planted trace (tests/_planted.py) with LLaDA2.1-style `edited` flags: {step: positions}."""
    d = P.build(with_maps=False)
    meta = {"family": "llada2", "mask_id": P.MASK_ID, "causal": False, "prompt_length": P.PROMPT,
            "block_length": P.BLOCK, "tokens_vocab": {str(k): v for k, v in P.VOCAB.items()},
            "sampler": {"name": "llada21", "args": {}}}
    with TraceWriter(path, meta, received_dtype="float32") as w:
        for t in range(P.T):
            ed = np.zeros(P.S, bool)
            ed[edits.get(t, [])] = True
            w.write_step(t, d["tokens"][t], is_masked=d["is_masked"][t], received=d["received"][t], edited=ed)
    return path


def test_sinks_on_edited_tokens_planted_and_real(traces, tmp_path):
    # planted: position 10 (head (0, 1)'s sink until step 5) rewritten at step 2, position 31
    # (head (0, 2)'s sink at every step) at step 7, position 12 (never a sink) at step 1
    edits = {1: [12], 2: [10], 7: [31]}
    a = analyze(_write_planted_with_edits(tmp_path / "edits.arrow", edits))
    e = edited_sinks(a)
    want = []
    for t in range(P.T):
        done = {p for s, ps in edits.items() if s <= t for p in ps}
        want.append(sum(len(pos & done) for pos in P.expected_sinks(t).values()))
    assert e.on_edited.tolist() == want and sum(want) > 0
    assert e.positions == [10, 12, 31]
    fig = F.sinks_on_edited(a)
    ring = [c for c in fig.axes[0].collections if c.get_label() == "sink on an edited token"][0]
    rings = {(int(x), int(y)) for x, y in ring.get_offsets()}
    assert rings == {(j, t) for t in range(P.T) for pos in P.expected_sinks(t).values() for j in pos
                     if any(s <= t and j in ps for s, ps in edits.items())}
    fig.savefig(tmp_path / "planted_fig12.png", dpi=110)
    # real LLaDA2.1 run: what the analysis calls edited is the trace's own flags, accumulated
    t = sinklens.open_trace(traces["llada21"])
    e = edited_sinks(analyze(traces["llada21"]))
    for i, step in enumerate(t.steps):
        flags = t.edited(step)
        np.testing.assert_array_equal(e.edited_at[i, : flags.size], flags)
        before = np.any([np.pad(t.edited(s), (0, e.edited_at.shape[1] - t.edited(s).size)) for s in t.steps[: i + 1]],
                        axis=0)
        np.testing.assert_array_equal(e.edited_before[i], before)
    assert e.edited_at.sum() > 0


@pytest.mark.slow
def test_compare_report_llada2_sdar_llada(traces, tmp_path, capsys):
    """`sinklens report a b c --labels ...`: one page, three columns; blocks, edits and the baseline
    view where they apply, and nowhere else."""
    out = tmp_path / "cmp"
    assert main(["report", str(traces["llada21"]), str(traces["sdar"]), str(traces["llada"]),
                 "--labels", "LLaDA2.1,SDAR,LLaDA", "--out", str(out), "-q"]) == 0
    s = json.loads((out / "summary.json").read_text())
    by = {tr["trace"]: tr for tr in s["traces"]}
    assert list(by) == ["LLaDA2.1", "SDAR", "LLaDA"]
    for name in ("LLaDA2.1", "SDAR", "LLaDA"):
        assert by[name]["block_dynamics"]["blocks"]                   # every one runs in blocks
        assert (out / name / "fig11_block_sinks.png").stat().st_size > 5000
    assert by["LLaDA2.1"]["edited_sinks"]["edits"] > 0 and by["SDAR"]["edited_sinks"] is None
    assert (out / "LLaDA2.1" / "fig12_sinks_on_edited.png").exists()
    assert not (out / "SDAR" / "fig12_sinks_on_edited.png").exists()
    # block-causal attention has a baseline (earlier blocks seen by more queries): its view is reported;
    # LLaDA's bidirectional blocks have none
    assert [a["units"] for a in by["LLaDA2.1"]["also"]] == ["uniform_ratio"]
    assert [a["units"] for a in by["SDAR"]["also"]] == ["uniform_ratio"]
    assert "also" not in by["LLaDA"]
    md = (out / "summary.md").read_text()
    sd = by["SDAR"]["block_dynamics"]
    assert ", ".join(f"block {b} {n}" for b, n in zip(sd["blocks"], sd["sinks"])) in md and "edited tokens:" in md
