"""Minimal decoders used to score the twins during training.

The real samplers live in `sinklens.samplers` (faithful to the official code, with tracing).
These are the same algorithms stripped to what training needs: the DLM uses LLaDA's
low-confidence remasking at temperature 0 (one token per step, semi-autoregressive blocks),
the ARM greedy decoding. Both run on the plain model with no attention capture.
"""
from __future__ import annotations

import torch


@torch.no_grad()
def dlm_generate(model, ids: torch.Tensor, am: torch.Tensor, *, gen_length: int, mask_id: int,
                 block_length: int | None = None, shift: bool = False) -> torch.Tensor:
    """Low-confidence greedy unmasking, steps = gen_length. Returns the answer region (B, G).
    `shift`: position i is predicted by the logits at i - 1 (Dream's convention)."""
    B, P = ids.shape
    block_length = block_length or gen_length
    if gen_length % block_length:
        raise ValueError(f"gen_length ({gen_length}) must be a multiple of block_length ({block_length})")
    x = torch.cat([ids, torch.full((B, gen_length), mask_id, dtype=ids.dtype)], 1)   # (B, S)
    full_am = torch.cat([am, torch.ones((B, gen_length), dtype=am.dtype)], 1)
    rows = torch.arange(B)
    for start in range(P, P + gen_length, block_length):
        for _ in range(block_length):
            logits = model(input_ids=x, attention_mask=full_am).logits.float()   # (B, S, V)
            if shift:
                logits = torch.cat([logits[:, :1], logits[:, :-1]], 1)
            p = logits.softmax(-1)
            conf, cand = p.max(-1)                                               # (B, S)
            allowed = x == mask_id
            allowed[:, :start] = False
            allowed[:, start + block_length:] = False
            conf = conf.masked_fill(~allowed, -float("inf"))
            pos = conf.argmax(-1)                                                # (B,)
            x[rows, pos] = cand[rows, pos]
    return x[:, P:]


@torch.no_grad()
def arm_generate(model, ids: torch.Tensor, am: torch.Tensor, *, gen_length: int, eos_id: int) -> torch.Tensor:
    """Greedy decoding (no cache: sequences are short). Returns (B, G), EOS after the first EOS."""
    B = ids.shape[0]
    x, m = ids, am
    done = torch.zeros(B, dtype=torch.bool)
    out = []
    for _ in range(gen_length):
        logits = model(input_ids=x, attention_mask=m).logits[:, -1].float()      # (B, V)
        nxt = logits.argmax(-1).masked_fill(done, eos_id)
        done |= nxt == eos_id
        out.append(nxt)
        x = torch.cat([x, nxt[:, None]], 1)
        m = torch.cat([m, torch.ones((B, 1), dtype=m.dtype)], 1)
        if done.all():
            break
    ans = torch.stack(out, 1)
    if ans.shape[1] < gen_length:
        ans = torch.cat([ans, torch.full((B, gen_length - ans.shape[1]), eos_id, dtype=ans.dtype)], 1)
    return ans
