"""The report and the masking agree on what a sink is: on the same run, the Eq. 3 sinks the
analysis finds in the trace and the ones the masking policy ranks at run time are the same set
of (step, layer, head, key), in the same units, for a DLM, an ARM and DiffusionGemma (canvas
queries over a cached prefix with sliding-window layers). And which keys the rule calls visible
is what the model's attention really reached: keys it calls invisible receive exactly 0."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import sinklens
from sinklens.analysis import analyze
from sinklens.masking.policy import MaskingConfig, SinkMaskingPolicy
from sinklens.samplers import CaptureOptions

torch.set_num_threads(1)


class SinkRecorder(SinkMaskingPolicy):
    """The masking policy's own Eq. 3 sinks of every step, with nothing blocked."""

    def __init__(self, model):
        super().__init__(MaskingConfig(mask_k=0), num_layers=model.num_layers, is_diffusion=model.is_diffusion,
                         model=model)
        self.per_step: list[np.ndarray] = []

    def after_step(self, event) -> None:
        self.per_step.append(self.rank_event(event).sinks[:, 0].numpy())      # (L, H, S) of batch row 0


def sink_sets(model, tmp_path, **kwargs):
    rec = SinkRecorder(model)
    out = model.generate(kwargs.pop("ids"), trace=tmp_path / "run.arrow", hook=rec,
                         capture=CaptureOptions(received_dtype="float32"), **kwargs)
    a = analyze(out.trace_path)                           # the report's analysis, default units
    s = a.sinks
    report = set(zip(s["step"].tolist(), s["layer"].tolist(), s["head"].tolist(), s["pos"].tolist()))
    masking = {(t, l, h, j) for t, m in enumerate(rec.per_step) for l, h, j in zip(*np.nonzero(m))}
    return report, masking, a


@pytest.fixture(scope="module")
def dlm():
    return sinklens.load("tiny-dlm")


@pytest.fixture(scope="module")
def arm():
    return sinklens.load("tiny-arm")


def test_dlm_report_and_masking_agree(dlm, tmp_path):
    ids = torch.tensor([dlm.apply_chat_template("Tom has 3 apples and buys 4 more. How many now?")])
    report, masking, a = sink_sets(dlm, tmp_path, ids=ids, gen_length=16, steps=16, block_length=8)
    assert report and report == masking
    assert a.units == "scaled_sum"


def test_arm_report_and_masking_agree(arm, tmp_path):
    ids = torch.tensor([arm.apply_chat_template("Tom has 3 apples and buys 4 more. How many now?")])
    report, masking, a = sink_sets(arm, tmp_path, ids=ids, max_new_tokens=8)
    # one newest query row per decoding step: on scaled sums Eq. 3 fires there too
    assert report and report == masking
    assert {t for t, *_ in report} - {0}


@pytest.fixture(scope="module")
def diffusion_gemma(tmp_path_factory):
    from test_diffusion_gemma import build

    return sinklens.load(build(tmp_path_factory.mktemp("dg") / "dg"))


def test_diffusion_gemma_report_and_masking_agree(diffusion_gemma, tmp_path):
    m = diffusion_gemma
    torch.manual_seed(0)
    ids = torch.randint(3, 96, (1, 10), generator=torch.Generator().manual_seed(5))
    report, masking, a = sink_sets(m, tmp_path, ids=ids, max_new_tokens=16, max_denoising_steps=4)
    assert report and report == masking
    assert a.source.layout.windows == m.attention_windows and a.source.layout.window_kind == "cache"


def test_diffusion_gemma_invisible_keys_receive_nothing(diffusion_gemma, tmp_path):
    """The sliding layers' cache keeps window − 1 keys before the canvas: the rule's visible set is
    exactly the keys that received attention, layer by layer, at every step."""
    m = diffusion_gemma
    assert m.attention_windows is not None and None in m.attention_windows     # sliding and global layers
    torch.manual_seed(0)
    ids = torch.randint(3, 96, (1, 10), generator=torch.Generator().manual_seed(5))
    out = m.generate(ids, max_new_tokens=24, max_denoising_steps=3, trace=tmp_path / "dg.arrow",
                     capture=CaptureOptions(received_dtype="float32"))
    from sinklens.analysis.analyze import step_scores
    from sinklens.analysis.source import as_source

    src = as_source(out.trace_path)
    vis = src.layout.visibilities(src.num_layers)
    cut = 0
    for t in range(src.num_steps):
        d = src.step_data(t)
        _, visible = step_scores(d, "scaled_sum", vis)                       # (L, S)
        reached = d.received.sum(1) > 0                                      # (L, S) some head's queries got there
        np.testing.assert_array_equal(visible, reached)
        cut += int((~visible & d.key_mask).sum())
    assert cut > 0                               # the windows did hide keys (a prefix longer than the window)


@pytest.fixture(scope="module")
def sdar():
    from pathlib import Path

    return sinklens.load(Path(__file__).resolve().parent / "fixtures" / "sdar")


def test_sdar_report_and_masking_agree(sdar, tmp_path):
    """Block-causal attention with a KV cache: the report (from the trace's layout) and the masking
    (from each step's layout) count the same visible keys, so their Eq. 3 sinks are one set."""
    torch.manual_seed(0)
    ids = torch.randint(0, 298, (1, 10), generator=torch.Generator().manual_seed(3))
    # blocks of 8 where the checkpoint's config says 4: only the step's own layout gives the right keys
    report, masking, a = sink_sets(sdar, tmp_path, ids=ids, gen_length=12, block_length=8, denoising_steps=3,
                                   top_k=1, remasking_strategy="low_confidence_static", stopping_criteria_idx=[])
    assert report and report == masking
    assert a.source.layout.attention_block == 8 and a.source.layout.query_rows == "block"


def test_sdar_invisible_keys_receive_nothing(sdar):
    """A block-causal forward whose summed queries are the first block only: the rule's visible
    keys (Visibility(block=4)) are exactly the keys that received attention; later blocks get 0."""
    from sinklens.attention import AttentionRequest
    from sinklens.rule import np_rule
    from sinklens.trace.layout import TraceLayout

    ids = torch.arange(20, 36)[None]                                     # 16 positions = 4 blocks
    for rows in (slice(0, 4), slice(4, 8), slice(0, 12)):
        q = torch.zeros(1, 16, dtype=torch.bool)
        q[0, rows] = True
        req = AttentionRequest(capture=True, query_mask=q)
        sdar.forward_logits(ids, attention=req)
        vis = TraceLayout(attention_block=4).visibilities(sdar.num_layers)
        visible = torch.from_numpy(np_rule.coverage(np.flatnonzero(q[0].numpy()), np.ones(16, bool), vis).visible)[:, None]  # (L, 1, S)
        reached = req.received.sum(2) > 0                              # (L, 1, S) some head got there
        assert torch.equal(visible, reached)
        assert (~visible).any()                                        # later blocks were hidden


def test_llada2_report_and_masking_agree(tmp_path):
    """Block-causal windows (LLaDA2): every query row of the window summed, each seeing its own and
    earlier blocks; the rule's visible keys are the keys that received attention."""
    from pathlib import Path

    m = sinklens.load(Path(__file__).parent / "fixtures" / "llada2")
    ids = torch.randint(0, 157, (1, 6), generator=torch.Generator().manual_seed(2))
    report, masking, a = sink_sets(m, tmp_path, ids=ids, gen_length=10, block_length=4, steps=4, threshold=0.5)
    assert report and report == masking
    assert a.source.layout.attention_block == 4
