"""Autoregressive sampler (Llama, Qwen2, SmolLM2, ...): greedy or sampled decoding with a KV cache.

Steps: step 0 is the prefill (the queries are the prompt's real rows); step t >= 1 feeds the
newest token only, so its captured attention is that token's row over the whole prefix (the
paper's ARM protocol). `capture_prefix=True` re-runs the whole prefix (without the cache) to
record every row's column sums; the tokens still come from the cached pass, so capture never
changes them.

Sampling is transformers' `generate`, token for token: temperature, top-k, top-p, min-p (the
filters of warpers.py), then one `multinomial` draw per step; a setting left None takes the
checkpoint's generation_config.json value, else transformers' default (`resolve`). A row that
produced a stop token is finished: its later tokens are the pad id; decoding stops when every
row has finished. Without an attention_mask, a prompt holding the pad id (when the pad is not a
stop token) is read as padded there, as `generate` infers its mask.
In a StepEvent / trace record the canvas of step t is the prefix the model saw (P + t tokens);
the token chosen at step t is the last token of step t + 1's canvas (and of `sequences`).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import DynamicCache, GenerationConfig

from sinklens.attention.request import AttentionRequest
from sinklens.samplers.capture import CaptureOptions
from sinklens.samplers.arm.config import ARMConfig
from sinklens.samplers.arm.warpers import warp
from sinklens.samplers.steps import GenerateOutput, attention_is_causal, check_inputs, steps
from sinklens.trace.layout import TraceLayout


SAMPLING = ("temperature", "top_k", "top_p", "min_p")
ARM_FRESH = ("is_masked", "revealed", "attention_mask", "query_positions")  # StepEvent.fresh: see `sample`


def resolve(config: ARMConfig, model) -> dict:
    """The sampling settings `generate` would use: the config's value, else the checkpoint's
    generation_config, else transformers' own default (read from transformers, not copied)."""
    gen = getattr(model.model, "generation_config", None)
    # transformers' own table (a private function, present from 5.20, the lowest version declared, to 5.23)
    defaults = GenerationConfig._get_default_generation_params()
    out = {}
    for name in SAMPLING:
        value = getattr(config, name)
        value = getattr(gen, name, None) if value is None else value
        out[name] = defaults.get(name) if value is None else value
    return out


def prompt_positions(attention_mask: torch.Tensor) -> torch.Tensor:
    """(B, P) position ids of the prompt as transformers' generate counts them: real tokens from 0
    after the left padding, pads 0."""
    mask = attention_mask.long()
    return (mask.cumsum(-1) - 1).masked_fill(mask == 0, 0)


def next_tokens(logits: torch.Tensor, do_sample: bool, settings: dict) -> torch.Tensor:
    """(B, V) float32 logits of the last position -> (B,) next token ids."""
    if not do_sample:
        return logits.argmax(dim=-1)
    logits = warp(logits, settings["temperature"], settings["top_k"], settings["top_p"], settings["min_p"])
    return torch.multinomial(F.softmax(logits, dim=-1), num_samples=1).squeeze(1)


@torch.no_grad()
def sample(model, input_ids, config: ARMConfig, attention_mask=None, *, trace=None, hook=None,
           capture: CaptureOptions | None = None, progress: bool = False) -> GenerateOutput:
    """Greedy (default) or sampled decoding of a causal model through the sinklens attention.

    input_ids (B, P), left-padded with attention_mask (B, P) for batches of unequal prompts (other
        padding runs too, positioned as `generate` positions it: `prompt_positions`).
    config.eos_token_id: stop token id(s) (default: the model's stop ids - EOS, end of turn - or
        its EOS id; none known = never stop early).
    """
    c = config
    max_new_tokens, do_sample = c.max_new_tokens, c.do_sample
    settings = resolve(c, model)
    if do_sample and not settings["temperature"] > 0:  # a checkpoint's generation_config may hold 0
        raise ValueError(f"do_sample=True needs temperature > 0, got {settings['temperature']}")
    if c.eos_token_id is None:
        stop = list(getattr(model, "stop_ids", None) or [i for i in [getattr(model, "eos_id", None)] if i is not None])
    else:
        stop = [c.eos_token_id] if isinstance(c.eos_token_id, int) else list(c.eos_token_id)
    known_pad = c.pad_token_id if c.pad_token_id is not None else getattr(model, "pad_id", None)
    pad = (stop[0] if stop else 0) if known_pad is None else known_pad
    args = {**c.to_dict(), **(settings if do_sample else {}), "eos_token_id": stop, "pad_token_id": pad}
    P = torch.as_tensor(input_ids).shape[-1]
    input_ids, attention_mask = check_inputs(input_ids, attention_mask, P + max_new_tokens,
                                                  getattr(model, "max_length", None))
    if attention_mask is None and known_pad is not None and pad not in stop and bool((input_ids == pad).any()):
        attention_mask = (input_ids != pad).long()  # generate's inferred mask: the pad id is padding
    B, device = input_ids.shape[0], input_ids.device
    capture_prefix = capture is not None and capture.capture_prefix
    rows = "prefix" if capture_prefix else "newest"
    layout = TraceLayout(causal=attention_is_causal(model), prompt_length=P, query_rows=rows)

    am = torch.ones_like(input_ids) if attention_mask is None else attention_mask.long()  # (B, P)
    seq = input_ids.clone()  # (B, P + t)
    cache = DynamicCache()
    finished = torch.zeros(B, dtype=torch.bool, device=device)
    with steps(model, capture, trace, hook, name="arm", args=args, input_ids=input_ids, seq_len=P + max_new_tokens,
               layout=layout, total=max_new_tokens, progress=progress, diffusion=False,
               extra={"arm_query_rows": rows}) as run:
        for step in range(max_new_tokens):
            S = seq.shape[1]
            real = am.bool()  # (B, S)
            not_masked = torch.zeros_like(real)
            hook_req = run.instructions(seq, not_masked, real)
            # (B, S) transformers' generate: the prompt counts real tokens (pads 0), each new token is
            # the previous position + 1 (so after a right-padded prompt it continues from the pad's 0)
            positions = prompt_positions(am) if step == 0 else torch.cat([positions, positions[:, -1:] + 1], dim=1)
            if step == 0:  # prefill: every real prompt row is a query
                feed, feed_pos, qmask = seq, positions, real
                query_positions = [torch.nonzero(r).squeeze(1) for r in real]
            else:  # decode: the newest token is the only query, and always real (no query mask to apply)
                feed, feed_pos, qmask = seq[:, -1:], positions[:, -1:], None
                query_positions = [torch.tensor([S - 1]) for _ in range(B)]
            req = run.record(hook_req, qmask, capture=not (capture_prefix and step > 0))
            logits = model.forward_cached(feed, am, feed_pos, cache, req)  # (B, S_q, V)
            if capture_prefix and step > 0:  # every prefix row, from a separate uncached pass
                req = run.record(AttentionRequest(blocked=None if req is None else req.blocked,
                                                  keep_self=req is not None and req.keep_self), real)
                model.forward_logits(seq, attention_mask=am, position_ids=positions, attention=req)
                query_positions = [torch.nonzero(r).squeeze(1) for r in real]
            if step == 0 and req is not None and req.query_mask is not None:  # a hook chose the query rows
                query_positions = [torch.nonzero(r).squeeze(1) for r in req.query_mask]
            nxt = next_tokens(logits[:, -1].float(), do_sample, settings)  # (B,)
            if stop:
                nxt = torch.where(finished, torch.full_like(nxt, pad), nxt)
                finished |= torch.isin(nxt, torch.tensor(stop, device=nxt.device))
            fed, seq = seq, torch.cat([seq, nxt[:, None]], dim=1)
            am = torch.cat([am, torch.ones(B, 1, dtype=am.dtype, device=device)], dim=1)
            # every tensor of the event but the canvas is made for this step alone (and the canvas is never
            # changed in place: `seq` is a new tensor each step); nothing of the canvas fed is revealed (the
            # token is appended after it): no commit probabilities
            run.step(fed, not_masked, logits, torch.zeros_like(real), after=seq, attention=req, attention_mask=real,
                     query_positions=query_positions, fresh=ARM_FRESH, commits=False)
            if stop and bool(finished.all()):
                break
    return run.output(seq)
