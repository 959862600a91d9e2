"""The dual twin's objective: one set of weights, a next-token loss and a block-diffusion loss.

The recipe of SDAR / LLaDA2 (and NVIDIA's Nemotron-Labs-Diffusion: one checkpoint, an AR mode and
a diffusion mode), at the twins' scale, started from a trained ARM twin:

  loss = next-token CE (causal attention, the ARM's loss)  +  block-diffusion CE   (summed 1 : 1)

Block diffusion is trained on the layout SDAR's sampler decodes with (sinklens/samplers/sdar/):
blocks of `block` positions counted from the sequence's first real token (the prompt included,
so the prompt's last partial block is denoised together with the first answer tokens). Per
(sequence, block) a ratio t ~ U(0, 1) masks ceil(t n) of the block's n answer tokens (never a
prompt token). Every block is trained in one forward over two copies of the sequence (SDAR's
training layout), `[noisy | clean]` of length 2S:

  noisy query in block b  sees  noisy keys of block b (bidirectional)  +  clean keys of blocks < b
  clean query in block b  sees  clean keys of blocks <= b               (block-causal: the KV cache)

so a noisy block sees exactly what the sampler's denoising forward sees (the cache holds the
finished earlier blocks, computed block-causally) and later blocks stay invisible. Prediction is
not shifted (SDAR): a masked position's own logits predict its token. Loss: the mean CE over the
masked tokens of the batch.

Left padding: positions are counted per row from its first real token (cumsum of the attention
mask), so blocks and RoPE positions are those of the same prompt decoded alone, without padding.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def row_positions(attention_mask: torch.Tensor) -> torch.Tensor:
    """(B, S) 1 = real token -> each token's position in its own unpadded row (pads: 0)."""
    m = attention_mask.long()
    return ((m.cumsum(-1) - 1) * m).clamp(min=0)


def two_copy_mask(pos: torch.Tensor, real: torch.Tensor, block: int) -> torch.Tensor:
    """(B, 1, 2S, 2S) bool attention of the `[noisy | clean]` forward (module docstring).
    pos (B, S) row positions, real (B, S) bool. A pad's row sees itself only (no empty softmax row)."""
    blk = pos // block                                                    # (B, S)
    bq, bk = blk[:, :, None], blk[:, None, :]                             # (B, S, 1), (B, 1, S)
    key = real[:, None, :]                                                # (B, 1, S)
    noisy_noisy = (bk == bq) & key
    noisy_clean = (bk < bq) & key
    clean_clean = (bk <= bq) & key
    none = torch.zeros_like(noisy_noisy)
    mask = torch.cat([torch.cat([noisy_noisy, noisy_clean], 2), torch.cat([none, clean_clean], 2)], 1)
    eye = torch.eye(mask.shape[1], dtype=torch.bool)[None]
    return (mask | eye)[:, None]                                          # (B, 1, 2S, 2S)


def mask_blocks(pos: torch.Tensor, answer: torch.Tensor, block: int, gen: torch.Generator) -> torch.Tensor:
    """(B, S) bool: per (row, block) ceil(t n) of the block's n answer tokens, t ~ U(0, 1), at
    least one; the chosen tokens uniformly at random within the block."""
    B, S = pos.shape
    blk = pos // block
    nb = int(blk.max()) + 2                                               # + a dummy group for non-answer tokens
    group = torch.where(answer, blk, torch.full_like(blk, nb - 1))        # (B, S)
    counts = torch.zeros(B, nb, dtype=torch.long).scatter_add_(1, group, torch.ones_like(group))
    counts[:, -1] = 0
    t = torch.rand(B, nb, generator=gen)
    k = (t * counts).ceil().long().clamp(min=1)                           # (B, nb) tokens to mask per block
    key = group.float() + torch.rand(B, S, generator=gen)                 # sorts by block, random inside
    rank = key.argsort(1).argsort(1)                                      # (B, S) global rank
    starts = counts.cumsum(1) - counts                                    # (B, nb) first rank of each block
    inside = rank - starts.gather(1, group)                               # (B, S) rank within its block
    return answer & (inside < k.gather(1, group))


def block_diffusion_loss(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, P: int, mask_id: int,
                         block: int, gen: torch.Generator):
    """Block-diffusion CE on the answer region (columns P..). Returns (loss, masked (B, S), correct (B, S))."""
    B, S = input_ids.shape
    real = attention_mask.bool()
    pos = row_positions(attention_mask)
    answer = torch.zeros_like(real)
    answer[:, P:] = True
    masked = mask_blocks(pos, answer, block, gen)
    noisy = input_ids.masked_fill(masked, mask_id)
    logits = model(input_ids=torch.cat([noisy, input_ids], 1), position_ids=torch.cat([pos, pos], 1),
                   attention_mask=two_copy_mask(pos, real, block)).logits[:, :S]     # (B, S, V) noisy rows
    ce = F.cross_entropy(logits.float()[masked], input_ids[masked])
    return ce, masked, logits.argmax(-1) == input_ids


@torch.no_grad()
def block_generate(model, ids: torch.Tensor, am: torch.Tensor, *, gen_length: int, mask_id: int, block: int,
                   parallel: bool = False) -> torch.Tensor:
    """Batched greedy block diffusion without a cache (training-time scoring; the shipped path is
    SDAR's sampler). Blocks of `block` from each row's first real token; per step, in every row's
    first block that still holds a [MASK], the first masked position is committed (`parallel`:
    every masked position of that block at once). A full block-causal forward per step: later
    blocks are invisible, so the active block's logits are those of the sampler's cached forward.
    Returns the answer region (B, G)."""
    B, P = ids.shape
    x = torch.cat([ids, torch.full((B, gen_length), mask_id, dtype=ids.dtype)], 1)      # (B, S)
    am = torch.cat([am, torch.ones((B, gen_length), dtype=am.dtype)], 1)
    pos = row_positions(am)
    blk = pos // block
    real = am.bool()
    mask = ((blk[:, None, :] <= blk[:, :, None]) & real[:, None, :]) | torch.eye(x.shape[1], dtype=torch.bool)[None]
    mask = mask[:, None]                                                                  # (B, 1, S, S)
    while bool((x == mask_id).any()):
        logits = model(input_ids=x, position_ids=pos, attention_mask=mask).logits          # (B, S, V)
        is_mask = x == mask_id
        active = torch.where(is_mask, blk, torch.full_like(blk, 1 << 30)).min(1, keepdim=True).values
        commit = is_mask & (blk == active)                                                # the active block's masks
        if not parallel:   # the first one only
            commit &= commit.long().cumsum(1) == 1
        x = torch.where(commit, logits.argmax(-1), x)
    return x[:, P:]


@torch.no_grad()
def evaluate_dual(model, tok, problems, cfg, batch_size: int = 100) -> dict:
    """Held-out exact answers in both modes: AR greedy (`exact_acc_ar`) and block diffusion, one
    token per step left to right in each block (`exact_acc_bd`, SDAR's `sequential` greedy) and the
    whole block in one step (`exact_acc_bd_parallel`, SDAR's greedy `low_confidence_dynamic`).
    `exact_acc` = the lower of the first two (the dual twin's target holds in both modes)."""
    from sinklens.train.batch import decode_answers, encode_prompts, parse_answer
    from sinklens.train.decode import arm_generate

    model.eval()
    hits = {"ar": 0, "bd": 0, "bd_parallel": 0}
    samples = []
    for i in range(0, len(problems), batch_size):
        chunk = problems[i:i + batch_size]
        ids, am = encode_prompts(tok, [p.question for p in chunk])
        outs = {"ar": arm_generate(model, ids, am, gen_length=cfg.gen_length, eos_id=tok.eos_token_id)}
        for name, parallel in (("bd", False), ("bd_parallel", True)):
            outs[name] = block_generate(model, ids, am, gen_length=cfg.gen_length, mask_id=tok.mask_token_id,
                                        block=cfg.block_length, parallel=parallel)
        for name, ans in outs.items():
            for p, text in zip(chunk, decode_answers(tok, ans)):
                ok = parse_answer(text) == p.answer
                hits[name] += ok
                if name == "bd" and len(samples) < 3:
                    samples.append({"question": p.question, "output": text, "ok": bool(ok)})
    model.train()
    n = len(problems)
    out = {f"exact_acc_{k}": v / n for k, v in hits.items()}
    return {"exact_acc": min(out["exact_acc_ar"], out["exact_acc_bd"]), **out, "n": n, "samples": samples}


def save_dual_folder(model, folder, *, eos_id: int, pad_id: int, mask_id: int, block: int, dtype=torch.float16) -> None:
    """A native Llama folder (transformers loads it as an ARM as is) whose config.json also holds
    SDAR's `block_size`, the `mask_token_id` and `dual_modes` (the modes sinklens runs it in, the
    first its default): sinklens loads it as block diffusion by default (models/sdar.py)."""
    import json
    from pathlib import Path

    from sinklens.models.sdar import DUAL_MODES
    from sinklens.train.model import save_llama_folder

    save_llama_folder(model, folder, eos_id=eos_id, pad_id=pad_id, dtype=dtype)
    path = Path(folder) / "config.json"
    config = json.loads(path.read_text())
    config.update(block_size=block, mask_token_id=mask_id, dual_modes=list(DUAL_MODES))
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
