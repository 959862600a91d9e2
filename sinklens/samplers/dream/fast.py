"""Fast-dLLM's cached block decoding for Dream (NVlabs/Fast-dLLM
`dream/model/generation_utils_block.py`, `_sample`), step for step.

The answer is decoded in blocks of `block_length` (default 32), `steps / num_blocks` steps each.
Per block:
  step 0  a forward of the whole canvas that stores every position's K/V (the cache refresh);
          its logits (shifted right by one, as Dream's) commit exactly one token: the block's
          first position, drawn with the plain token draw (temperature / top-p / top-k, over
          every position of the canvas, so the RNG stream is the official one);
  then    forwards of the fed rows over the cache: prefix = the rows [start, S) (the block and
          every later position) over the cached prefix; dual = the block's rows only, over the
          cached prefix and suffix (sinklens/samplers/kvcache.py). Their logits are shifted
          right by one *within the fed rows* (the first fed row keeps its own, as the official).
          Commits:
            threshold   (Fast-dLLM's alg='confidence_threshold') confidence = the drawn token's
                        probability over every masked fed row; the most confident masked position
                        of the block commits, and every other one whose confidence reaches the
                        threshold; the block runs until it has no [MASK] left;
            no threshold  Dream's schedule over the block with time grid
                        linspace(1, time_eps, steps_per_block + 1), i counting from 1, ranked by
                        negative entropy (whatever `alg` says; sinklens asks for alg='entropy'),
                        top-k or, with alg_temp, sampled positions.

Kept from the official code on purpose (they decide which tokens come out, or how many steps):
- without a threshold a block gets steps_per_block - 1 scheduled steps after step 0, and the
  loop stops only after a forward finds i == steps_per_block: with one step per block, that
  forward commits nothing and the block keeps its [MASK] ids (the returned canvas holds them);
- the scheduled count is the masked count *averaged over the batch* (as Dream's sampler);
- with a threshold the suffix's masked rows (prefix cache) are drawn too (RNG), then dropped.
Batches: the dual cache and the threshold take one prompt (the official code indexes row 0 /
breaks on a batch); the prefix cache without a threshold takes a batch. No padding (the
official cached forward slices its padding mask to the wrong shape).

Trace: one record per forward. `tokens` is the whole canvas, which is also the keys every step
sees (cached or fresh, in position order); `query_positions` are the rows that were computed.
Every key is visible to every query, so the sink rule counts cached keys as visible keys, and
blocked keys stay blocked for the computed rows whether they come from the cache or not.
`keep_self` masking with the dual cache is refused (see sinklens/samplers/llada/fast.py).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from sinklens.samplers.capture import CaptureOptions
from sinklens.samplers.dream.config import DreamConfig
from sinklens.samplers.dream.draw import sample_tokens
from sinklens.samplers.kvcache import StepCache, fast_start
from sinklens.samplers.schedules import linear_time
from sinklens.samplers.steps import GenerateOutput, attention_is_causal, steps
from sinklens.trace.layout import TraceLayout


def shift(logits: torch.Tensor) -> torch.Tensor:
    """(B, L, V) -> position j predicted from j - 1 (the first row keeps its own), as Dream's."""
    return torch.cat([logits[:, :1], logits[:, :-1]], dim=1)


def threshold_commit(c: DreamConfig, logits, rows, mask_index, bl: int, block_masked: int, mask_id: int):
    """Fast-dLLM's confidence_threshold step over the fed rows (batch 1): (B, L) bool commits, and
    writes them into `rows`."""
    confidence, x0 = sample_tokens(logits[mask_index], c.temperature, c.top_p, c.top_k)
    candidates = torch.full_like(rows, mask_id)
    candidates[mask_index] = x0
    full = torch.full(rows.shape, -torch.inf, dtype=logits.dtype, device=rows.device)  # (1, L)
    full[mask_index] = confidence
    full[:, bl:] = -torch.inf  # later blocks wait
    values, idx = torch.topk(full, block_masked)
    transfer = torch.zeros_like(rows, dtype=torch.bool)
    transfer[0, idx[0]] = True
    transfer[0, idx[0, 1:][values[0, 1:] < c.threshold]] = False  # the most confident always commits
    rows[transfer] = candidates[transfer]
    return transfer


def scheduled_commit(c: DreamConfig, logits, rows, mask_index, bl: int, t, s, last: bool, mask_id: int):
    """Dream's scheduled step over the block (entropy ranking): (B, L) bool commits, written into `rows`."""
    mask_index = mask_index.clone()
    mask_index[:, bl:] = False
    confidence, x0 = sample_tokens(logits[mask_index], c.temperature, c.top_p, c.top_k, confidence="neg_entropy")
    n_masked = mask_index.sum() / mask_index.shape[0]  # float32 batch average (official)
    n = linear_time(n_masked, t, s, last)
    full = torch.full(rows.shape, -torch.inf, dtype=logits.dtype, device=rows.device)  # (B, L)
    full[mask_index] = confidence
    full[:, bl:] = -torch.inf
    transfer = torch.zeros_like(rows, dtype=torch.bool)
    if n > 0:
        if c.alg_temp is None or c.alg_temp == 0:
            _, idx = torch.topk(full, n)  # (B, n)
        else:
            idx = torch.multinomial(F.softmax(full / c.alg_temp, dim=-1), num_samples=n)
        candidates = torch.full_like(rows, mask_id)
        candidates[mask_index] = x0
        r = torch.arange(rows.shape[0], device=rows.device)[:, None].expand_as(idx)
        rows[r, idx] = candidates[r, idx]
        transfer[r, idx] = True
    return transfer


@torch.no_grad()
def sample_fast(model, input_ids, config: DreamConfig, attention_mask=None, *, trace=None, hook=None,
                capture: CaptureOptions | None = None, progress: bool = False) -> GenerateOutput:
    """Fast-dLLM's Dream block decoding (see the module docstring). input_ids (B, P), no padding."""
    c = config
    one_prompt = c.cache == "dual" or c.threshold is not None
    x, input_ids, mask_id, args, P, S = fast_start(
        model, input_ids, attention_mask, c, c.max_new_tokens, f"cache={c.cache!r} with threshold={c.threshold!r}",
        one_prompt=("batch 1, as Fast-dLLM's code; a batch runs with cache='prefix' and no threshold")
        if one_prompt else None, padding_why="Fast-dLLM's cached Dream forward cannot mask pads",
        needs_bidirectional=True)
    B, device = x.shape[0], x.device
    bl, steps_per_block = c.cached_block_length, c.steps // c.num_blocks
    timesteps = torch.linspace(1, c.time_eps, steps_per_block + 1, device=device)  # float32, as the official grid

    layout = TraceLayout(causal=attention_is_causal(model), prompt_length=P,
                         block_length=bl if bl < c.max_new_tokens else None, query_rows="block")

    real = torch.ones_like(x, dtype=torch.bool)
    with steps(model, capture, trace, hook, name="dream", args=args, input_ids=input_ids, seq_len=S, layout=layout,
               total=c.steps, progress=progress, layout_to_hooks=True) as run:
        for b in range(c.num_blocks):
            start, end = P + b * bl, P + (b + 1) * bl
            cache = StepCache()
            i = 0  # the official counter: 0 = the refresh, then it counts scheduled steps from 1
            first = True
            while True:
                r0 = 0 if first else start  # fed rows [r0, r1)
                r1 = end if not first and c.cache == "dual" else S
                rows = x[:, r0:r1]  # (B, L) a view: commits land in x
                is_masked = x == mask_id  # (B, S)
                hook_req = run.instructions(x, is_masked, real)
                if not first and c.cache == "dual" and hook_req is not None and hook_req.keep_self:
                    raise ValueError("keep_self masking cannot be combined with cache='dual' (the block's queries sit "
                                     "mid-sequence); use cache='prefix' or keep_self=False")
                req = run.record(hook_req, torch.ones_like(rows, dtype=torch.bool), rows == mask_id)  # (B, L) queries
                if not first:
                    cache.read_at(start)
                raw = model.forward_cached(rows, None, torch.arange(r0, r1, device=device)[None].expand(B, -1), cache,
                                           attention=req, first_row=r0).to(model.dtype)  # (B, L, V) as the official
                logits = shift(raw)
                mask_index = rows == mask_id  # (B, L)
                transfer = torch.zeros_like(rows, dtype=torch.bool)
                stop = False
                if first:
                    if c.cache == "prefix":
                        cache.keep(start)
                    _, x0 = sample_tokens(logits.reshape(-1, logits.shape[-1]), c.temperature, c.top_p, c.top_k)
                    x0 = x0.view(B, S)  # every position drawn (one draw over B * S rows, as the official)
                    x[:, start] = x0[:, start]
                    transfer[:, start] = True
                elif c.threshold is not None:
                    block_masked = int((x[:, start:end] == mask_id).sum())
                    transfer = threshold_commit(c, logits, rows, mask_index, bl, block_masked, mask_id)
                elif i == steps_per_block:
                    stop = True  # the official loop breaks here, after this step's forward
                else:
                    transfer = scheduled_commit(c, logits, rows, mask_index, bl, timesteps[i], timesteps[i + 1],
                                                i == steps_per_block - 1, mask_id)
                    i += 1
                run.step(x, is_masked, logits.float(), F.pad(transfer, (r0, S - r1)), after=x, block=(start, end),
                         attention_mask=real, query_positions=[torch.arange(r0, r1)] * B)
                if first:
                    first, i = False, 1
                    continue  # the official loop always runs after the refresh
                if stop or not bool((x[:, start:end] == mask_id).any()):
                    break
    return run.output(x)
