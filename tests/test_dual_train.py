"""The dual twin's block-diffusion loss trains on exactly what SDAR's sampler later shows the model:
the two-copy forward's noisy block sees what a forward of (finished earlier blocks + this block)
sees under block-causal attention, blocks counted from the row's first real token (left padding
changes nothing), and only answer tokens are ever masked."""
from __future__ import annotations

import pytest
import torch
from transformers import AutoTokenizer, LlamaForCausalLM

from sinklens.models.loader import ASSETS
from sinklens.train.batch import encode_batch
from sinklens.train.config import TrainConfig
from sinklens.train.data import DataConfig, generate
from sinklens.train.dual import mask_blocks, row_positions, two_copy_mask

BLOCK = 4


@pytest.fixture(scope="module")
def arm():
    folder = ASSETS / "tiny-arm"
    return LlamaForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval(), AutoTokenizer.from_pretrained(str(folder))


@pytest.fixture(scope="module")
def batch(arm):
    _, tok = arm
    problems = generate(6, seed=3, split="train", cfg=DataConfig(max_ops=1))
    b = encode_batch(tok, problems, 16)
    assert not bool(b.attention_mask.all())   # left padding present: the rows' blocks start at different columns
    return b


def test_masks_only_answer_tokens_and_at_least_one_per_block(batch):
    pos = row_positions(batch.attention_mask)
    answer = torch.zeros_like(batch.attention_mask, dtype=torch.bool)
    answer[:, batch.prompt_len:] = True
    for seed in range(5):
        masked = mask_blocks(pos, answer, BLOCK, torch.Generator().manual_seed(seed))
        assert not bool(masked[:, :batch.prompt_len].any())
        blk = pos // BLOCK
        for r in range(pos.shape[0]):
            for b in blk[r, batch.prompt_len:].unique():
                in_block = answer[r] & (blk[r] == b)
                assert 1 <= int(masked[r][in_block].sum()) <= int(in_block.sum())


@torch.no_grad()
def test_noisy_block_sees_what_the_sampler_shows(arm, batch):
    """Noisy rows of the two-copy forward == the last block's rows of a plain forward of the row alone
    (no padding), cut after that block, earlier blocks clean, under block-causal attention."""
    model, tok = arm
    pos = row_positions(batch.attention_mask)
    real = batch.attention_mask.bool()
    answer = torch.zeros_like(real)
    answer[:, batch.prompt_len:] = True
    masked = mask_blocks(pos, answer, BLOCK, torch.Generator().manual_seed(0))
    noisy = batch.input_ids.masked_fill(masked, tok.mask_token_id)
    S = batch.input_ids.shape[1]
    two = model(input_ids=torch.cat([noisy, batch.input_ids], 1), position_ids=torch.cat([pos, pos], 1),
                attention_mask=two_copy_mask(pos, real, BLOCK)).logits[:, :S]
    checked = 0
    for r in range(batch.input_ids.shape[0]):
        ids, nz = batch.input_ids[r][real[r]], noisy[r][real[r]]          # the row alone, unpadded
        off = int((~real[r]).sum())
        for b in range(-(-len(ids) // BLOCK)):
            s, e = b * BLOCK, min((b + 1) * BLOCK, len(ids))
            if not bool(masked[r, off + s:off + e].any()):
                continue
            x = torch.cat([ids[:s], nz[s:e]])[None]                           # finished blocks, then this one
            p = torch.arange(e)
            bc = ((p[None, :] // BLOCK) <= (p[:, None] // BLOCK))[None, None]
            ref = model(input_ids=x, position_ids=p[None], attention_mask=bc).logits[0, s:e]
            torch.testing.assert_close(two[r, off + s:off + e], ref, rtol=1e-4, atol=1e-4)
            checked += 1
    assert checked >= batch.input_ids.shape[0] * 3


def test_dual_needs_a_block():
    with pytest.raises(ValueError, match="block-length"):
        TrainConfig(kind="dual", out="x")
    assert not TrainConfig(kind="dual", out="x", block_length=4).diffusion   # causal by default (its AR mode)
