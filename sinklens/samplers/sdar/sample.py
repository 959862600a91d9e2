"""SDAR's block diffusion sampler with its KV cache (JetAstra/SDAR `block_diffusion_generate`),
written out step by step so every denoising step can be traced and hooked.

The canvas is the prompt followed by [MASK] up to a whole number of blocks
(ceil((P + gen_length) / block_length) blocks, counted from position 0: the prompt's last
partial block is denoised together with the first generated tokens). Attention is block-causal.
  1. prefill: one forward over the prompt's whole blocks stores their keys and values;
  2. per remaining block, up to `denoising_steps` denoising forwards of the block alone
     (queries = the block; keys = the cache + the block; nothing stored): a token is sampled at
     every block position (temperature, top-k, top-p; confidence = the probability of the
     *sampled* token) and some masked positions are committed, by the quota of the step
     (`block_length` spread over the steps, the remainder to the earliest) or the strategy:
       low_confidence_dynamic  every position above `confidence_threshold`, if at least the
                               quota; else the quota's most confident
       low_confidence_static   the quota's most confident
       sequential              the quota, left to right from the first masked position
  3. once the block has no [MASK] left, one more forward of the finished block stores its
     keys and values (so cached K/V come from the block's final tokens);
  4. stop after a block when any stop id occurs anywhere after the prompt.

Official behaviour kept on purpose (tests/fixtures/sdar):
- the whole canvas is returned: after a stop, the later blocks are still [MASK] ids, and the
  canvas may be longer than P + gen_length (whole blocks);
- the quota is taken by top-k over all block positions: when fewer positions are masked than the
  quota (the prompt shares the first block), top-k also picks unmasked positions, which are then
  *rewritten* with the token sampled there (a prompt token or an earlier commit can change);
- greedy is `top_k=1` (every confidence is then 1.0, so low_confidence_dynamic commits the whole
  block in one step); temperature 0 is refused (the official code divides by it);
- one prompt at a time, without padding, as the official function (batch 1).

Trace: one record per denoising forward. The step's tokens are the canvas up to the end of the
block (the keys); its query rows are the block's (`query_positions`); the layout says
block-causal attention in blocks of `block_length` from position 0, so the sink rule sees exactly
the keys these queries could see. The prefill and store forwards are not steps, on purpose: they
predict and commit nothing, and a step is what a hook acts on (masking blocks at step t the sinks
ranked at t - 1; a store forward between them would shift that protocol). What they computed is
not lost: their query rows together are the rows of one block-causal forward of the final canvas
(cached keys are the blocks' final tokens), so `model.forward_logits(out.sequences,
attention=AttentionRequest(capture=True))` with `block_length` = the checkpoint's `block_size` gives
their attention (tests/test_sdar_untraced_forwards.py); the keys they stored are in every later
step's record, as the cache's columns.
Masking: the policy's blocked keys cover the cache and the block; the store forward of a
finished block keeps the last step's blocked keys, so the cached K/V come from the masked model.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from sinklens.attention.request import AttentionRequest
from sinklens.samplers.capture import CaptureOptions
from sinklens.samplers.schedules import spread
from sinklens.samplers.sdar.config import SDARConfig
from sinklens.samplers.steps import GenerateOutput, check_inputs, check_top_k, mask_id_of, steps
from sinklens.trace.layout import TraceLayout


def filter_top_k(logits: torch.Tensor, k: int) -> torch.Tensor:
    """(N, V): every logit below the k-th largest of its row becomes -inf (ties kept)."""
    kth = torch.topk(logits, k).values[..., -1:]
    return logits.masked_fill(logits < kth, float("-inf"))


def filter_top_p(logits: torch.Tensor, p: float) -> torch.Tensor:
    """(N, V): keep the most likely tokens until their mass exceeds p (the token that crosses p stays)."""
    ordered, order = torch.sort(logits, descending=True)
    mass = torch.cumsum(F.softmax(ordered, dim=-1), dim=-1)
    drop = mass > p
    drop[..., 1:] = drop[..., :-1].clone()  # shift right: the first token past p is kept
    drop[..., 0] = False
    return logits.masked_fill(torch.zeros_like(drop).scatter(-1, order, drop), float("-inf"))


def draw(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, S, V) -> sampled tokens (B, S) and their probabilities (B, S). One multinomial draw over
    all B*S rows, in the official order (the RNG stream is part of the result)."""
    shape, V = logits.shape[:-1], logits.shape[-1]
    flat = logits.reshape(-1, V)
    if temperature != 1.0:
        flat = flat / temperature
    if top_k > 0:
        flat = filter_top_k(flat, top_k)
    if top_p < 1.0:
        flat = filter_top_p(flat, top_p)
    probs = F.softmax(flat, dim=-1)
    token = torch.multinomial(probs, num_samples=1)  # (B*S, 1)
    return token.view(shape), torch.gather(probs, -1, token).view(shape)


def choose(strategy: str, is_masked: torch.Tensor, prob: torch.Tensor, n: int, threshold: float) -> torch.Tensor:
    """(1, S) bool positions to commit at a step with quota n (see the module docstring)."""
    transfer = torch.zeros_like(is_masked)
    row = is_masked[0]
    if strategy == "sequential":
        first = int(row.nonzero()[0])
        transfer[0, first:first + n] = True
        return transfer
    confidence = torch.where(is_masked, prob, torch.full_like(prob, float("-inf")))[0]  # (S,)
    if strategy == "low_confidence_dynamic":
        high = confidence > threshold
        if int(high.sum()) >= n:
            transfer[0] = high
            return transfer
    transfer[0, torch.topk(confidence, n).indices] = True  # may reach unmasked positions (quirk above)
    return transfer


def stop_ids(config: SDARConfig, model) -> list[int]:
    """The ids that end a generation: the config's, else generation_config.json's EOS (as the
    official script), else the model's stop ids."""
    if config.stopping_criteria_idx is not None:
        ids = config.stopping_criteria_idx
        return [ids] if isinstance(ids, int) else list(ids)
    gen = getattr(getattr(model, "model", None), "generation_config", None)
    eos = getattr(gen, "eos_token_id", None)
    if eos is None:
        return list(getattr(model, "stop_ids", ()) or ())
    return [eos] if isinstance(eos, int) else list(eos)


@torch.no_grad()
def sample(model, input_ids, config: SDARConfig, attention_mask=None, *, trace=None, hook=None,
           capture: CaptureOptions | None = None, progress: bool = False) -> GenerateOutput:
    """SDAR generation. input_ids (1, P), no padding."""
    c = config
    ops = model.family.ops
    if ops is None or not hasattr(ops, "forward_block"):
        raise ValueError(f"the sdar sampler needs an SDAR checkpoint, got family {model.family.name!r}")
    mask_id = mask_id_of(model, c)
    check_top_k(model, c.top_k)
    bl, denoising = c.block_length, c.denoising_steps
    P = torch.as_tensor(input_ids).shape[-1]
    num_blocks = -(-(P + c.gen_length) // bl)
    total = num_blocks * bl
    input_ids, attention_mask = check_inputs(input_ids, attention_mask, total, getattr(model, "max_length", None))
    if input_ids.shape[0] != 1:
        raise ValueError(f"the sdar sampler takes one prompt at a time (batch 1, as the official code), "
                         f"got a batch of {input_ids.shape[0]}")
    if attention_mask is not None and not bool(attention_mask.bool().all()):
        raise ValueError("the sdar sampler takes no padding (the official code has no attention mask): "
                         "pass the prompt without pad tokens")
    stops = stop_ids(c, model)
    args = {**c.to_dict(), "mask_id": mask_id, "stopping_criteria_idx": stops}
    device = model.device

    layout = TraceLayout(causal=False, prompt_length=P, query_rows="block", attention_block=bl)
    layout = layout.with_model_facts(model.attention_layout)  # the sampler's block wins over the config's

    x = torch.full((1, total), mask_id, dtype=torch.long, device=device)  # (1, S) the canvas
    x[:, :P] = input_ids.to(device)
    cache = ops.new_cache(model)
    prefill_blocks = P // bl
    if prefill_blocks > 0:
        ops.forward_block(model, x[:, :prefill_blocks * bl], 0, cache, store=True, block=bl)
    n_per_step = spread(bl, denoising)  # block_length over the steps
    with steps(model, capture, trace, hook, name="sdar", args=args, input_ids=input_ids, seq_len=total, layout=layout,
               total=(num_blocks - prefill_blocks) * denoising, progress=progress, layout_to_hooks=True) as run:
        for nb in range(prefill_blocks, num_blocks):
            s, e = nb * bl, (nb + 1) * bl
            cur = x[:, s:e].clone()  # (1, bl) the active block
            req = None
            for i in range(denoising + 1):
                is_masked = cur == mask_id  # (1, bl)
                if not bool(is_masked.any()):
                    # store the finished block's K/V (with the last step's blocked keys, if any)
                    store_req = None if req is None or req.blocked is None else AttentionRequest(
                        blocked=req.blocked, keep_self=req.keep_self)
                    ops.forward_block(model, cur, s, cache, store=True, block=bl, attention=store_req)
                    break
                if i == denoising:
                    raise ValueError(f"block {nb} still holds [MASK] after {denoising} denoising steps (a sampled token "
                                     "was the mask id itself); the official code fails here too")
                tokens = torch.cat([x[:, :s], cur], dim=1)  # (1, e): the keys of this step
                masked_all = tokens == mask_id
                real = torch.ones_like(tokens, dtype=torch.bool)
                # every block row (1, bl) is a query
                req = run.request(tokens, masked_all, real, queries=torch.ones_like(is_masked), queries_masked=is_masked)
                logits = ops.forward_block(model, cur, s, cache, store=False, block=bl, attention=req)  # (1, bl, V)
                x0, prob = draw(logits, c.temperature, c.top_k, c.top_p)
                transfer = choose(c.remasking_strategy, is_masked, prob, n_per_step[i], c.confidence_threshold)
                cur[transfer] = x0[transfer]
                after = torch.cat([x[:, :s], cur, x[:, e:]], dim=1)
                run.step(tokens, masked_all, logits, F.pad(transfer, (s, 0), value=False), after=after, block=(s, e),
                         attention_mask=real, query_positions=[torch.arange(s, e)])
            x[:, s:e] = cur
            if stops and bool(torch.isin(x[:, P:], torch.tensor(stops, device=device)).any()):
                break
    return run.output(x)

