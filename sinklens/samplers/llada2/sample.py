"""LLaDA2.0 sampler, step for step the `generate()` of the official LLaDA2.0 model file.

Block diffusion without a KV cache, batch 1. The canvas is the prompt followed by mask tokens up
to a whole number of blocks, blocks counted from position 0 (so the prompt's last partial block
is denoised together with the first generated tokens). For each block from the one holding the
prompt's end: every step re-runs the whole window (positions 0 .. block end) under the
block-causal mask, samples a token and its probability at each position of the current block,
and commits every masked position whose probability exceeds `threshold`, or, when fewer than
the step's quota do, the quota's most confident ones. The quota schedule spreads the block
length over `steps` steps (the remainder to the earliest); a block whose masks are all gone
stops early. After a block, the run stops if an end token was generated.

Kept from the official code on purpose (they decide which tokens come out):
- `steps` is capped at gen_length // minimal_topk;
- the quota is block_length spread over the steps, not the block's mask count, so a block that
  starts with prompt tokens still commits up to block_length per schedule; when steps >
  block_length the later quotas are 0 and a step commits only what exceeds the threshold, so a
  block can end with masks left in it (they stay in the output);
- eos_early_stop looks for the first end token in the whole window (prompt included) and
  returns the tokens after the prompt up to it when no mask precedes it;
- the return value: the tokens after the prompt, cut after the first end token.
`sequences` here is the prompt followed by that return value (1, P + n).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from sinklens.samplers import base
from sinklens.samplers.llada2.config import LLaDA2Config
from sinklens.trace.layout import TraceLayout


def quota_schedule(block_length: int, steps: int) -> list[int]:
    """Tokens to commit per step when too few pass the threshold: block_length over `steps`
    steps, the remainder (+1 each) to the earliest."""
    base_, remainder = divmod(block_length, steps) if steps else (0, 0)
    return [base_ + (i < remainder) for i in range(steps)]


def top_k_logits(logits: torch.Tensor, k: int | None) -> torch.Tensor:
    if k is None or k <= 0:
        return logits
    kth = torch.topk(logits, k).values[..., -1, None]
    return torch.where(logits < kth, torch.full_like(logits, float("-inf")), logits)


def top_p_logits(logits: torch.Tensor, p: float | None) -> torch.Tensor:
    if p is None or p >= 1.0:
        return logits
    sorted_logits, order = torch.sort(logits, descending=True)
    cut = torch.cumsum(F.softmax(sorted_logits, dim=-1), dim=-1) > p
    cut[..., 1:] = cut[..., :-1].clone()  # keep the token that crosses p
    cut[..., 0] = False
    drop = torch.scatter(torch.zeros_like(logits, dtype=torch.bool), -1, order, cut)
    return logits.masked_fill(drop, float("-inf"))


def sample_tokens(logits: torch.Tensor, temperature: float, top_k: int | None, top_p: float | None,
                  greedy_on_logits: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens, their probabilities), both (B, S), from logits (B, S, V). Greedy at temperature 0:
    LLaDA2.0 takes the argmax of the probabilities, LLaDA2.1 of the logits (`greedy_on_logits`; the
    same token but for exact ties after the softmax)."""
    shape = logits.shape[:-1]
    logits = logits.reshape(-1, logits.shape[-1])
    if temperature == 0.0:
        probs = F.softmax(logits, dim=-1)
        token = torch.argmax(logits if greedy_on_logits else probs, dim=-1, keepdim=True)
        return token.view(shape), torch.gather(probs, -1, token).view(shape)
    if temperature != 1.0:
        logits = logits / temperature
    probs = F.softmax(top_p_logits(top_k_logits(logits, top_k), top_p), dim=-1)
    token = torch.multinomial(probs, num_samples=1)
    return token.view(shape), torch.gather(probs, -1, token).view(shape)


def commit_masked(confidence: torch.Tensor, active: torch.Tensor, threshold: float, quota: int) -> torch.Tensor:
    """(L,) bool positions of the block to commit: every one with confidence > threshold, or, when
    fewer than `quota` are, the `quota` most confident (at most the masked count). confidence: (L,)
    with -inf on unmasked positions; active: (L,) bool masked."""
    high = (confidence > threshold) & active
    if int(high.sum()) >= quota:
        return high
    out = torch.zeros_like(active)
    out[torch.topk(confidence, k=min(quota, int(active.sum()))).indices] = True
    return out


def canvas(input_ids: torch.Tensor, gen_length: int, block_length: int, mask_id: int) -> torch.Tensor:
    """(1, num_blocks · block_length) the prompt followed by mask tokens up to whole blocks."""
    P = input_ids.shape[1]
    total = (P + gen_length + block_length - 1) // block_length * block_length
    x = torch.full((1, total), mask_id, dtype=torch.long, device=input_ids.device)
    x[:, :P] = input_ids
    return x


def official_return(x: torch.Tensor, P: int, gen_length: int, eos_id: int) -> torch.Tensor:
    """The official return value: the tokens after the prompt (at most gen_length), cut after the first
    end token; here with the prompt in front (1, P + n)."""
    answer = x[:, P:P + gen_length]
    eos = (answer[0] == eos_id).nonzero()
    n = int(eos[0]) + 1 if len(eos) else gen_length
    return torch.cat([x[:, :P], answer[:, :n]], dim=1)


def check_batch_one(input_ids, attention_mask, name: str) -> None:
    if input_ids.shape[0] != 1:
        raise ValueError(f"the {name} sampler runs one prompt at a time (the official generate() is batch 1), "
                         f"got a batch of {input_ids.shape[0]}")
    if attention_mask is not None and not bool(torch.as_tensor(attention_mask).bool().all()):
        raise ValueError(f"the {name} sampler takes no padding (batch 1): drop the attention_mask's zeros")


def special_ids(model, config) -> tuple[int, int]:
    mask_id = model.mask_id if config.mask_id is None else config.mask_id
    eos_id = model.eos_id if config.eos_id is None else config.eos_id
    if mask_id is None or eos_id is None:
        raise ValueError(f"{'mask_id' if mask_id is None else 'eos_id'} is None: the model does not name it; "
                         f"pass {'mask_id' if mask_id is None else 'eos_id'}=...")
    return mask_id, eos_id


def window_layout(model, P: int, block_length: int) -> TraceLayout:
    """Each step's `received` sums every row of the window (queries 0 .. block end), each seeing the keys
    of its own and earlier blocks counted from position 0; S grows by a block per block."""
    return TraceLayout(causal=False, prompt_length=P, block_length=None, query_rows="all",
                       attention_block=block_length)


@dataclass
class Run:
    """What both LLaDA2 samplers set up once: the canvas, ids, trace writer and hooks."""

    x: torch.Tensor  # (1, T) canvas: prompt + mask tokens up to whole blocks
    P: int  # prompt length
    mask_id: int
    eos_id: int
    writer: object
    hooks: base.Hooks  # the user's hooks and the trace writer
    capture: base.CaptureOptions | None
    layout: TraceLayout  # block-causal from position 0: handed to the hooks with every step (masking reads it)


def start_run(model, input_ids, attention_mask, c, name: str, *, trace, hook, capture) -> Run:
    """Checks (batch 1, no padding, the context), the canvas and the trace writer of a run."""
    mask_id, eos_id = special_ids(model, c)
    base.check_top_k(model, c.top_k if c.temperature > 0 else None)  # greedy never reads top_k, there as here
    P = torch.as_tensor(input_ids).shape[-1]
    input_ids, attention_mask = base.check_inputs(input_ids, attention_mask, P + c.gen_length,
                                                  getattr(model, "max_length", None))
    check_batch_one(input_ids, attention_mask, name)
    x = canvas(input_ids, c.gen_length, c.block_length, mask_id)
    args = {**c.to_dict(), "mask_id": mask_id, "eos_id": eos_id}
    hooks, capture = base.setup_hooks(hook, trace, capture, diffusion=True)
    layout = window_layout(model, P, c.block_length)
    writer = base.open_trace_writer(trace, model, name, args, input_ids, capture, x.shape[1], layout=layout)
    return Run(x, P, mask_id, eos_id, writer, base.Hooks(hooks.hooks + ([writer] if writer is not None else [])),
               capture, layout)


def window_forward(model, run: Run, win: torch.Tensor, step: int, block_length: int):
    """One step's forward of the window (1, S): (canvas fed, is_masked (1, S), request, logits (1, S, V))."""
    masked = win == run.mask_id
    real = torch.ones_like(masked)
    groups = base.masked_unmasked_groups(masked, real) if run.capture and run.capture.query_groups else None
    req = base.build_request(run.hooks.before_step(step, win, masked, real), run.capture, step, None, groups)
    tokens_in = win.clone()
    return tokens_in, masked, req, model.family.ops.window_logits(model, win, block_length, attention=req)


def after_step(run: Run, step: int, tokens_in, masked, req, logits, revealed, edited=None) -> None:
    """Hand the step to the hooks; revealed / edited: (bl,) bool over the current (last) block."""
    if not run.hooks:
        return
    bl = revealed.shape[0]
    end = tokens_in.shape[1]
    on_canvas = lambda block_flags: torch.cat([torch.zeros(1, end - bl, dtype=torch.bool, device=masked.device),  # noqa: E731
                                               block_flags[None]], dim=1)
    run.hooks.after_step(base.StepEvent(step=step, tokens=tokens_in, is_masked=masked, revealed=on_canvas(revealed),
                                        logits=logits, attention=req, block=(end - bl, end),
                                        edited=None if edited is None else on_canvas(edited),
                                        attention_mask=torch.ones_like(masked), layout=run.layout))


@torch.no_grad()
def sample(model, input_ids, config: LLaDA2Config, attention_mask=None, *, trace=None, hook=None,
           capture: base.CaptureOptions | None = None, progress: bool = False) -> base.GenerateOutput:
    """LLaDA2.0's generate(). `model`: a SinkModel of the llada2 family (its `family.ops.window_logits`).

    input_ids (1, P); trace: a path or TraceWriter to record every step; hook: a step hook or a list;
    capture: what to record (default when tracing: received + masked/unmasked split).
    """
    c = config
    run = start_run(model, input_ids, attention_mask, c, "llada2", trace=trace, hook=hook, capture=capture)
    x, P, bl = run.x, run.P, c.block_length
    steps = min(c.steps, c.gen_length // c.minimal_topk)
    schedule = quota_schedule(bl, steps)
    num_blocks = x.shape[1] // bl
    history, step = [], 0
    with base.run_context(run.writer, trace, (num_blocks - P // bl) * steps, progress, "llada2") as bar:
        for b in range(P // bl, num_blocks):
            end = (b + 1) * bl
            win = x[:, :end]  # a view: commits land in x
            for i in range(steps):
                active = win[0, -bl:] == run.mask_id  # (bl,)
                if not bool(active.any()):
                    break  # the block finished early
                tokens_in, masked, req, logits = window_forward(model, run, win, step, bl)  # logits (1, end, V)
                x0, x0_p = sample_tokens(logits[:, -bl:], c.temperature, c.top_k, c.top_p)  # (1, bl) each
                confidence = torch.where(active, x0_p[0], -torch.inf)
                commit = commit_masked(confidence, active, c.threshold, schedule[i])  # (bl,)
                win[0, -bl:][commit] = x0[0][commit]
                history.append(x.clone())
                after_step(run, step, tokens_in, masked, req, logits, commit)
                step += 1
                if bar is not None:
                    bar.update(1)
                if c.eos_early_stop and bool((x0[0][commit] == run.eos_id).any()):
                    eos = (win[0] == run.eos_id).nonzero()  # the first end token of the window, prompt included
                    if len(eos) and bool((win[0, P:int(eos[0])] != run.mask_id).all()):
                        out = torch.cat([x[:, :P], x[:, P:int(eos[0]) + 1]], dim=1)
                        return base.GenerateOutput(sequences=out, history=history, num_steps=step,
                                                   trace_path=None if run.writer is None else run.writer.path)
            if bool((x[0, P:end] == run.eos_id).any()):
                break  # an end token was generated: no further block
    return base.GenerateOutput(sequences=official_return(x, P, c.gen_length, run.eos_id), history=history,
                               num_steps=step, trace_path=None if run.writer is None else run.writer.path)
