"""Corpus runs fold each step into the prompt's part as the sampler runs (sinklens/analysis/stream.py,
sinklens/eval/stream.py): the same bytes as analysing the prompt's trace (`reduce_trace`), memory
that does not grow with the number of steps, and no trace file for a prompt that is not kept.
"""
from __future__ import annotations

import json
import os
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from sinklens.analysis.analyze import AnalysisConfig, analyze
from sinklens.analysis.corpus import prompt_part, to_json
from sinklens.analysis.source import ArraySource, StepData
from sinklens.analysis.stream import PromptStream
from sinklens.eval.corpus import CorpusConfig, reduce_trace, run_corpus
from sinklens.samplers.capture import CaptureOptions

EVERY_READOUT = dict(value_norms=True, qk_norms=True, diagonal=True, distance=True, hidden_norms=True, lens_layers=[0])


def planted(T: int, L: int, H: int, S: int, seed: int = 0) -> dict:
    """Arrays of a run whose heads have sinks that stay, drift right, vanish and reappear, with
    every readout and the masked / unmasked split."""
    rng = np.random.default_rng(seed)
    rec = rng.gamma(1.0, 1.0, (T, L, H, S))
    for t in range(T):
        for l in range(L):
            for h in range(H):
                rec[t, l, h, 0] += 60 * ((h + 1) % 2)                                        # a static sink
                for _ in range(rng.integers(0, 3)):                                    # drifting, coming and going
                    rec[t, l, h, (t // 3 + rng.integers(0, 4)) % S] += rng.uniform(10, 40)
    rec = (rec / rec.sum(-1, keepdims=True) * S).astype(np.float32)
    g = rng.random((T, 2, L, H, S)).astype(np.float32)
    lhs = lambda: rng.gamma(2, 1, (T, L, H, S)).astype(np.float32)   # noqa: E731
    readouts = {"value_norm": lhs(), "key_norm": lhs(), "qk_cos": rng.uniform(-1, 1, (T, L, H, S)).astype(np.float32),
                "diagonal": rng.uniform(0, 1, (T, L, H)).astype(np.float32), "distance": lhs(),
                "hidden_norm": rng.gamma(2, 1, (T, L, S)).astype(np.float32),
                "hidden_top_channels": rng.integers(0, 50, (T, L, S, 2)).astype(np.int32),
                "hidden_top_values": rng.standard_normal((T, L, S, 2)).astype(np.float32),
                "lens_positions": np.tile(np.arange(2, dtype=np.int32), (T, 1)),
                "lens_tokens": rng.integers(0, 20, (T, 1, 2, 3)).astype(np.int32),
                "lens_probs": rng.random((T, 1, 2, 3)).astype(np.float32)}
    return dict(received=rec, tokens=rng.integers(0, 20, (T, S)), is_masked=rng.random((T, S)) < 0.5,
                received_groups=g / g.sum(1, keepdims=True) * rec[:, None], readouts=readouts,
                learned_sink=rng.random((T, L, H)).astype(np.float32))


VOCAB = {i: "\n" if i % 5 == 0 else f"t{i}" for i in range(20)}


@pytest.mark.slow
@pytest.mark.parametrize("T, L, H, S, causal", [(24, 3, 4, 20, False), (40, 2, 3, 12, True), (130, 1, 1, 10, False)])
def test_the_stream_gives_the_trace_analysis_part_byte_for_byte(T, L, H, S, causal):
    """Every analysis' part, the dynamics and the per-trace-only list, in both units views, from steps
    handed over one at a time, equal (as JSON text) to analysing all the steps at once. 130 steps of
    one head: numpy sums a per-step series pairwise, not in order, and so must the stream."""
    src = ArraySource(**planted(T, L, H, S), vocab=VOCAB, causal=causal, mask_id=3)
    meta = {"layout": src.layout.to_meta(), "mask_id": 3, "query_groups": ["masked", "unmasked"]}
    refs = {}
    for units in ("scaled_sum", "uniform_ratio"):
        cfg = AnalysisConfig(units=units)
        refs[units] = ref = to_json(prompt_part(analyze(src, cfg)))
        s = PromptStream(meta, cfg, {str(k): v for k, v in VOCAB.items()})
        for t in range(T):
            s.add(src.step_data(t))
        assert json.dumps(to_json(s.part())) == json.dumps(ref), units
    ref = refs["scaled_sum"]
    dyn = ref["dynamics"]                                   # the planted run exercises every rule
    for key in ("tracks_static", "tracks_moving", "births", "deaths", "largest_vanish", "largest_appear"):
        assert np.sum(dyn[key]) > 0 or L * H == 1, key      # (one head of 10 keys: no room for both kinds)
    assert ref["k_sigma"]["jaccard"]["sum"] % 1 != 0 and set(ref["per_trace_only"]) == {
        "absorption", "massive_activations", "logit_lens"}


def _peak_bytes(T: int, L: int, H: int, S: int) -> int:
    """tracemalloc peak of folding T steps whose arrays are made one at a time (as a sampler does)."""
    rng = np.random.default_rng(0)
    s = PromptStream({"query_groups": ["masked", "unmasked"]}, AnalysisConfig())
    tracemalloc.start()
    for t in range(T):
        rec = rng.gamma(1.0, 1.0, (L, H, S)).astype(np.float32)
        rec[:, :, t % S] += 40                                                  # a sink that moves every step
        rec = rec / rec.sum(-1, keepdims=True) * S
        s.add(StepData(step=t, received=rec, tokens=rng.integers(0, 50, S), is_masked=np.arange(S) > t % S,
                       key_mask=np.ones(S, bool), query_positions=np.arange(S),
                       received_groups=np.stack([rec / 2, rec / 2]),
                       readouts={"value_norm": rec.copy(), "distance": rec.copy(),
                                 "diagonal": rng.random((L, H)).astype(np.float32)}))
    s.part()
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return peak


@pytest.mark.slow
def test_memory_does_not_grow_with_the_number_of_steps():
    L, H, S = 4, 6, 64
    short, long = _peak_bytes(16, L, H, S), _peak_bytes(256, L, H, S)
    assert long < 1.5 * short, (short, long)
    assert long < 256 * L * H * S * 4 / 4          # far below the (T, L, H, S) float32 received attention


@pytest.fixture(scope="module")
def twins():
    from sinklens.models.loader import load

    return {name: load(name) for name in ("tiny-dlm", "tiny-arm")}


def _prompts(path: Path, n: int) -> Path:
    path.write_text("".join(json.dumps({"prompt": f"Tom has {i} apples" + " and more" * i}) + "\n" for i in range(n)))
    return path


def _check_against_traces(corpus: Path) -> None:
    """Each line's parts are reduce_trace of its kept trace, as JSON text, and so is the whole file."""
    head, *lines = corpus.read_text().splitlines(keepends=True)
    meta = json.loads(head)
    rebuilt = [head]
    for line in lines:
        rec = json.loads(line)
        ref = reduce_trace(corpus.parent / rec["trace"], meta["units"], meta["sink_eps"])
        assert json.dumps(rec["parts"], ensure_ascii=False) == json.dumps(ref, ensure_ascii=False)
        rebuilt.append(json.dumps({**rec, "parts": ref}, ensure_ascii=False) + "\n")
    assert "".join(rebuilt) == corpus.read_text()


@pytest.mark.parametrize("name, settings", [("tiny-dlm", {"steps": 4, "gen_length": 8, "block_length": 4}),
                                            ("tiny-dlm", {"steps": 8, "gen_length": 8, "block_length": 4,
                                                          "cache": "dual", "threshold": 0.9}),   # cached steps
                                            ("tiny-arm", {"max_new_tokens": 5})])
def test_corpus_file_equals_the_trace_path_with_every_readout(twins, name, settings, tmp_path):
    path = run_corpus(CorpusConfig(model=name, prompts=str(_prompts(tmp_path / "p.jsonl", 3)), out=str(tmp_path / "run"),
                                   keep_traces=3, sampler_args=settings, capture=CaptureOptions(**EVERY_READOUT)),
                      model=twins[name])
    views = json.loads(Path(path).read_text().splitlines()[1])["parts"]
    assert list(views) == (["scaled_sum", "uniform_ratio"] if name == "tiny-arm" else ["scaled_sum"])
    assert {"sink_vectors", "massive_activations", "diagonal_heads", "distance_profile"} <= set(views["scaled_sum"])
    _check_against_traces(Path(path))


@pytest.mark.slow
def test_smollm2_corpus_file_equals_the_trace_path(smollm2, tmp_path):
    path = run_corpus(CorpusConfig(model="smollm2-135m-instruct", prompts=str(_prompts(tmp_path / "p.jsonl", 2)),
                                   out=str(tmp_path / "run"), keep_traces=2, sampler_args={"max_new_tokens": 2},
                                   capture=CaptureOptions(**{**EVERY_READOUT, "lens_layers": [29]})), model=smollm2)
    _check_against_traces(Path(path))


def test_no_trace_file_is_written_for_a_prompt_not_kept(twins, tmp_path, monkeypatch):
    from sinklens.trace import writer

    opened = []
    init = writer.TraceWriter.__init__

    def spy(self, path, *args, **kwargs):
        opened.append(os.path.relpath(path, tmp_path))
        init(self, path, *args, **kwargs)

    monkeypatch.setattr(writer.TraceWriter, "__init__", spy)
    run_corpus(CorpusConfig(model="tiny-dlm", prompts=str(_prompts(tmp_path / "p.jsonl", 3)), out=str(tmp_path / "run"),
                            keep_traces=1, sampler_args={"steps": 2, "gen_length": 4, "block_length": 4}),
               model=twins["tiny-dlm"])
    assert opened == [os.path.join("run", "traces", "000000.arrow")]
    assert sorted(os.listdir(tmp_path / "run" / "traces")) == ["000000.arrow"]


class GapsSource(ArraySource):
    """A planted run whose diagonal readout is missing at every third step."""

    def step_data(self, index: int) -> StepData:
        d = super().step_data(index)
        if index % 3 == 1:
            d.readouts.pop("diagonal")
        return d


def test_a_readout_missing_at_some_steps_streams_exactly_for_the_diagonal():
    """The diagonal heads' absorption counts every step of a run that has the diagonal at some step."""
    src = GapsSource(**planted(12, 2, 3, 10), vocab=VOCAB)
    ref = to_json(prompt_part(analyze(src)))
    s = PromptStream({}, AnalysisConfig(), {str(k): v for k, v in VOCAB.items()})
    for t in range(12):
        s.add(src.step_data(t))
    got = to_json(s.part())
    assert got["diagonal_heads"] == ref["diagonal_heads"]
    assert np.sum(ref["diagonal_heads"]["absorption"]["n"]) == 12 * 2 * 3 > np.sum(ref["diagonal_heads"]["diagonal"]["n"])
