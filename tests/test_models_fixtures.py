"""The official-format tiny LLaDA / Dream checkpoints reproduce the official code's logits.

Reference: logits.safetensors written by the official remote-code models (see the fixture
READMEs); nothing here was produced by sinklens.
"""
import pytest
import torch
from safetensors.torch import load_file

import sinklens
from sinklens.attention import AttentionRequest


@pytest.mark.parametrize("capture", [False, True], ids=["plain", "capture"])
@pytest.mark.parametrize("family", ["llada", "dream"])
@pytest.mark.parametrize("case", ["forward_nopad", "forward_leftpad"])
def test_fixture_logits_match_official(fixtures_dir, family, case, capture):
    """Plain and capture mode both reproduce the official logits at non-pad positions."""
    folder = fixtures_dir / family
    ref = load_file(str(folder / "logits.safetensors"))
    m = sinklens.load(folder)
    assert m.family.name == family and m.is_diffusion
    ids = ref[f"{case}.input_ids"]  # (B, S)
    mask = ref.get(f"{case}.attention_mask")  # (B, S) or None
    req = AttentionRequest(capture=True) if capture else None
    logits = m.forward_logits(ids, attention_mask=mask, attention=req)  # (B, S, V)
    expected = ref[f"{case}.logits"]
    assert logits.shape == expected.shape
    real = torch.ones_like(ids, dtype=torch.bool) if mask is None else mask.bool()
    if mask is not None:
        assert (~real).any(), "the padded case must contain padding"
    diff = (logits - expected).abs()[real]  # compare only non-pad positions
    assert diff.max().item() <= 1e-4
    if capture:  # padded query rows are not summed: total received = real queries per row
        total = req.received.sum(-1)  # (L, B, H)
        assert torch.allclose(total, real.sum(-1).float()[None, :, None].expand_as(total), atol=1e-4)


@pytest.mark.parametrize("family", ["llada", "dream"])
def test_fixture_special_ids_from_config(fixtures_dir, family):
    m = sinklens.load(fixtures_dir / family)
    # The tiny fixtures use mask 300, eos = pad 299 (not the 8B ids 126336 / 151666).
    assert (m.mask_id, m.eos_id, m.pad_id) == (300, 299, 299)
    assert m.tokenizer is None  # the fixture folders ship no tokenizer
    assert m.model.config.is_causal is False
    assert (m.num_layers, m.num_heads) == (2, 4)
    assert m.num_kv_heads == {"llada": 4, "dream": 2}[family]


@pytest.mark.parametrize("family", ["llada", "dream"])
def test_dlm_is_bidirectional(fixtures_dir, family):
    """Changing the LAST token must change position 0's logits in a DLM."""
    m = sinklens.load(fixtures_dir / family)
    ids = torch.arange(10, 26)[None]  # (1, 16)
    other = ids.clone()
    other[0, -1] = 200
    a, b = m.forward_logits(ids), m.forward_logits(other)
    assert (a[0, 0] - b[0, 0]).abs().max().item() > 1e-3


def test_dream_left_padding_shifts_positions(fixtures_dir):
    """Dream: cumsum(mask) - 1 with pads set to 1, as stored with the official call."""
    ref = load_file(str(fixtures_dir / "dream" / "logits.safetensors"))
    m = sinklens.load(fixtures_dir / "dream")
    pos = m.position_ids_for(ref["forward_leftpad.attention_mask"])
    assert torch.equal(pos, ref["forward_leftpad.position_ids"])
    assert sinklens.load(fixtures_dir / "llada").position_ids_for(ref["forward_leftpad.attention_mask"]) is None
