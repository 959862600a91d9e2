"""The learned sink in the trace and the analysis: a tiny random gpt-oss (sink logits per head)
traced through its ARM sampler stores `learned_sink` per step, and per (step, layer, head) the
trace's column sums plus the learned sink equal the number of summed query rows; the analysis
reports the share; a model without sink logits, and a trace written before the column existed,
read as before (no learned sink anywhere)."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
import torch

import sinklens
from sinklens.analysis import analyze
from sinklens.samplers.capture import CaptureOptions

torch.set_num_threads(1)

SMALL = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             head_dim=16, vocab_size=128, max_position_embeddings=64, pad_token_id=0, bos_token_id=1, eos_token_id=2)


def tiny(tmp_path, model_type: str, **extra):
    """A tiny random checkpoint folder; gpt-oss gets sink logits large enough to take a visible share."""
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    config = AutoConfig.for_model(model_type, **SMALL, **extra)
    model = AutoModelForCausalLM.from_config(config)
    for mod in model.modules():
        if isinstance(getattr(mod, "sinks", None), torch.nn.Parameter):
            mod.sinks.data = torch.randn(mod.sinks.shape) * 2
    folder = tmp_path / model_type
    model.save_pretrained(folder, safe_serialization=True)
    return folder


def traced(folder, path, capture_prefix: bool):
    m = sinklens.load(folder)
    ids = torch.randint(3, 128, (1, 7), generator=torch.Generator().manual_seed(1))
    capture = CaptureOptions(capture_prefix=capture_prefix, received_dtype="float32")
    m.generate(ids, max_new_tokens=4, eos_token_id=[], trace=path, capture=capture)
    return sinklens.open_trace(path)


@pytest.mark.parametrize("capture_prefix", [False, True])
def test_gpt_oss_trace_sums_plus_learned_sink_equal_query_rows(tmp_path, capture_prefix):
    folder = tiny(tmp_path, "gpt_oss", layer_types=["sliding_attention", "full_attention"], sliding_window=4,
                  num_local_experts=4, num_experts_per_tok=2)
    t = traced(folder, tmp_path / "t.arrow", capture_prefix)
    assert t.num_steps == 4
    for step in t.steps:
        sink = t.learned_sink(step)
        assert sink is not None and sink.shape == (2, 4) and sink.min() > 1e-3
        rows = len(t.query_positions(step))
        total = t.received(step).sum(-1) + sink                              # (L, H)
        np.testing.assert_allclose(total, np.full((2, 4), rows), atol=1e-4 * rows, rtol=0)

    a = analyze(t)
    share = a.learned_sink_share                                             # (T, L, H)
    assert share.shape == (4, 2, 4)
    for i, step in enumerate(t.steps):
        np.testing.assert_allclose(share[i], t.learned_sink(step) / len(t.query_positions(step)), rtol=1e-6)
    d = a.to_dict()["learned_sink"]
    assert d["mean"] == pytest.approx(float(share.mean()), rel=1e-5)
    assert len(d["per_layer_mean"]) == 2 and len(d["per_step_mean"]) == 4
    assert any(name == "learned sink" for name, _ in a.summary_rows())

    from sinklens.report.options import ReportOptions
    from sinklens.report.report import build_report

    r = build_report([t.path], tmp_path / "rep", options=ReportOptions(figures=False))
    assert "- learned sink: the sink logits took" in r.summary_md.read_text()


def test_models_without_learned_sinks_and_older_traces_read_as_before(tmp_path):
    t = traced(tiny(tmp_path, "llama"), tmp_path / "llama.arrow", capture_prefix=False)
    assert all(t.learned_sink(s) is None for s in t.steps)
    a = analyze(t)
    assert a.learned_sink_share is None and a.to_dict()["learned_sink"] is None
    assert all(name != "learned sink" for name, _ in a.summary_rows())

    # a trace written before the column existed: the same stream without `learned_sink`
    old_path = tmp_path / "old.arrow"
    table = t.table()
    old = table.drop_columns(["learned_sink"]).replace_schema_metadata(table.schema.metadata)
    with pa.OSFile(str(old_path), "wb") as f, pa.ipc.new_stream(f, old.schema) as w:
        for batch in old.to_batches():
            w.write_batch(batch)
    o = sinklens.open_trace(old_path)
    assert "learned_sink" not in o.schema.names and o.steps == t.steps
    for s in t.steps:
        assert o.learned_sink(s) is None
        np.testing.assert_array_equal(o.received(s), t.received(s))
    b = analyze(o)
    assert b.learned_sink_share is None
    np.testing.assert_array_equal(b.largest_pos, a.largest_pos)
