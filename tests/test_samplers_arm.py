"""ARM sampler against transformers' own `generate` (greedy and sampled, left padding), and the
paper's ARM picture on a real model: SmolLM2's position-0 sink in a 32-token greedy trace."""
import numpy as np
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

import sinklens
from sinklens.samplers import CaptureOptions

torch.set_num_threads(1)  # small models: threads only contend on the shared 2-core machine


@pytest.fixture(scope="module")
def tiny_arm(tmp_path_factory):
    """A random Llama saved as safetensors and loaded the normal way (sinklens attention)."""
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      eos_token_id=None, pad_token_id=0, bos_token_id=None)
    folder = tmp_path_factory.mktemp("tiny-arm")
    LlamaForCausalLM(cfg).save_pretrained(folder)
    reference = LlamaForCausalLM.from_pretrained(folder, attn_implementation="sdpa").eval()
    return sinklens.load(folder), reference


def _batch():
    ids = torch.randint(1, 97, (2, 7), generator=torch.Generator().manual_seed(1))
    am = torch.ones(2, 7, dtype=torch.long)
    ids[0, :3], am[0, :3] = 0, 0  # row 0 left-padded
    return ids, am


def test_greedy_equals_transformers_generate_with_and_without_capture(tiny_arm, tmp_path):
    m, ref = tiny_arm
    ids, am = _batch()
    expected = ref.generate(ids, attention_mask=am, max_new_tokens=12, do_sample=False, pad_token_id=0)
    out = m.generate(ids, am, max_new_tokens=12)
    assert out.sequences.tolist() == expected.tolist()
    traced = m.generate(ids, am, max_new_tokens=12, trace=tmp_path / "t.arrow")
    assert traced.sequences.tolist() == expected.tolist()
    t = traced.trace
    assert t.num_steps == 12 and t.meta["arm_query_rows"] == "newest" and t.meta["query_groups"] is None
    # step 0 = prefill: every real prompt row is a query; later steps: the newest token only
    np.testing.assert_array_equal(t.query_positions(0, 0), [3, 4, 5, 6])
    np.testing.assert_allclose(t.received(0, 0).sum(-1), 4, rtol=2e-3)
    for step in (1, 11):
        S = 7 + step
        np.testing.assert_array_equal(t.tokens(step, 1), expected[1, :S].numpy())
        np.testing.assert_array_equal(t.query_positions(step, 0), [S - 1])
        rec = t.received(step, 0)
        assert rec.shape == (3, 4, S)
        np.testing.assert_allclose(rec.sum(-1), 1, rtol=2e-3)
        assert (rec[:, :, :3] == 0).all()  # padding receives nothing
    # every step's canvas as the model saw it, though the writer keeps the ARM's per-step tensors without
    # a copy (StepEvent.fresh): the prefix, row 0's padding, nothing masked, nothing revealed
    for step in range(12):
        S = 7 + step
        for row in (0, 1):
            np.testing.assert_array_equal(t.tokens(step, row), expected[row, :S].numpy())
            np.testing.assert_array_equal(t.attention_mask(step, row), np.arange(S) >= (3 if row == 0 else 0))
            assert not t.is_masked(step, row).any() and not t.revealed(step, row).any()
            np.testing.assert_array_equal(t.query_positions(step, row), [S - 1] if step else np.arange(3 * (row == 0), 7))
    allr = t.received_all(0)
    assert allr.shape == (12, 3, 4, 18) and np.isnan(allr[0, :, :, 7:]).all()

    prefix = m.generate(ids, am, max_new_tokens=12, trace=tmp_path / "p.arrow", capture=CaptureOptions(capture_prefix=True))
    assert prefix.sequences.tolist() == expected.tolist()
    tp = prefix.trace
    np.testing.assert_array_equal(tp.query_positions(5, 0), np.arange(3, 12))
    np.testing.assert_allclose(tp.received(5, 1).sum(-1), 12, rtol=2e-3)
    # the newest row of the prefix capture is the decode step's row: prefix sums >= newest row
    assert (tp.received(5, 0) >= t.received(5, 0) - 1e-3).all()


def test_sampled_equals_transformers_generate(tiny_arm):
    m, ref = tiny_arm
    ids, am = _batch()
    kw = dict(max_new_tokens=10, do_sample=True, temperature=0.7, top_k=20, top_p=0.9)
    torch.manual_seed(5)
    expected = ref.generate(ids, attention_mask=am, pad_token_id=0, **kw)
    torch.manual_seed(5)
    assert m.generate(ids, am, **kw).sequences.tolist() == expected.tolist()


def test_stops_at_eos_and_pads_finished_rows(tiny_arm):
    m, _ = tiny_arm
    ids, am = _batch()
    greedy = m.generate(ids, am, max_new_tokens=12).sequences
    stop = int(greedy[0, 9])  # row 0's third generated token becomes the stop token
    out = m.generate(ids, am, max_new_tokens=12, eos_token_id=stop).sequences
    first = [int(np.flatnonzero(r[7:].numpy() == stop)[0]) if (r[7:] == stop).any() else None for r in greedy]
    assert out[0, 7 + first[0]] == stop and (out[0, 8 + first[0]:] == m.pad_id).all()
    if first[1] is None:  # row 1 never stops: decoding runs to the end
        assert out.shape[1] == 19 and out[1].tolist() == greedy[1].tolist()


@pytest.mark.parametrize("kwargs,match", [
    (dict(max_new_tokens=0), "max_new_tokens must be a positive integer"),
    (dict(max_new_tokens=60), "exceeds the model's context of 64"),
    (dict(do_sample=True, temperature=0.0), "temperature > 0"),
    (dict(steps=4), r"unknown argument\(s\) \['steps'\]"),
])
def test_arm_bad_inputs(tiny_arm, kwargs, match):
    m, _ = tiny_arm
    with pytest.raises((ValueError, TypeError), match=match):
        m.generate(*_batch(), **kwargs)


@pytest.mark.slow
def test_smollm2_trace_shows_the_position0_sink(smollm2, tmp_path):
    m = smollm2
    ids = torch.tensor([m.apply_chat_template("Name three colours of the rainbow.")])
    expected = m.model.generate(ids, max_new_tokens=32, do_sample=False, pad_token_id=m.pad_id)
    out = m.generate(ids, max_new_tokens=32, eos_token_id=[], trace=tmp_path / "smol.arrow")
    n = min(out.sequences.shape[1], expected.shape[1])  # transformers may stop at EOS earlier
    assert out.sequences[:, :n].tolist() == expected[:, :n].tolist()
    t = out.trace
    assert t.num_steps == 32 and t.num_layers == 30 and t.num_heads == 9
    deep = slice(2, None)
    # prefill (all prompt rows, column sums): Eq. 3 with eps = 3 flags position 0 (measured: 92 %)
    rec = t.received(0)[deep]  # (L', H, S)
    others = (rec.sum(-1) - rec[..., 0]) / (rec.shape[-1] - 1)
    assert ((rec[..., 0] - others) >= 3).mean() > 0.75
    # decoding steps (the newest token's row sums to 1): position 0 gets >= 4x its uniform share
    # 1/S, i.e. Eq. 3's margin of 3 in multiples of uniform attention (measured: 82 %)
    share = np.stack([t.received(s)[deep][..., 0] * len(t.tokens(s)) for s in t.steps[1:]])  # (T-1, L', H)
    assert (share >= 4).mean() > 0.7
