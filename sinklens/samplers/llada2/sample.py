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

from sinklens.samplers.capture import CaptureOptions
from sinklens.samplers.llada2.config import LLaDA2Config
from sinklens.samplers.schedules import spread
from sinklens.samplers.steps import GenerateOutput, Steps, check_inputs, check_top_k, steps
from sinklens.trace.layout import TraceLayout


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
class Start:
    """What both LLaDA2 samplers set up before their loop: the canvas, ids and the trace's facts."""

    x: torch.Tensor  # (1, T) canvas: prompt + mask tokens up to whole blocks
    P: int  # prompt length
    mask_id: int
    eos_id: int
    args: dict  # the sampler's settings, as the trace records them
    input_ids: torch.Tensor  # (1, P) the checked prompt
    layout: TraceLayout  # block-causal from position 0: handed to the hooks with every step (masking reads it)


def start(model, input_ids, attention_mask, c, name: str) -> Start:
    """Checks (batch 1, no padding, the context) and the canvas of a run."""
    mask_id, eos_id = special_ids(model, c)
    check_top_k(model, c.top_k if c.temperature > 0 else None)  # greedy never reads top_k, there as here
    P = torch.as_tensor(input_ids).shape[-1]
    input_ids, attention_mask = check_inputs(input_ids, attention_mask, P + c.gen_length,
                                             getattr(model, "max_length", None))
    check_batch_one(input_ids, attention_mask, name)
    x = canvas(input_ids, c.gen_length, c.block_length, mask_id)
    args = {**c.to_dict(), "mask_id": mask_id, "eos_id": eos_id}
    return Start(x, P, mask_id, eos_id, args, input_ids, window_layout(model, P, c.block_length))


def window_forward(model, run: Steps, win: torch.Tensor, mask_id: int, block_length: int):
    """One step's forward of the window (1, S): (is_masked (1, S), logits (1, S, V)); every window row
    is a query."""
    masked = win == mask_id
    req = run.request(win, masked, torch.ones_like(masked))
    return masked, model.family.ops.window_logits(model, win, block_length, attention=req)


def on_canvas(block_flags: torch.Tensor, end: int) -> torch.Tensor:
    """(bl,) flags over the current (last) block of the window -> (1, end) over the window."""
    return F.pad(block_flags[None], (end - block_flags.shape[0], 0), value=False)


@torch.no_grad()
def sample(model, input_ids, config: LLaDA2Config, attention_mask=None, *, trace=None, hook=None,
           capture: CaptureOptions | None = None, progress: bool = False) -> GenerateOutput:
    """LLaDA2.0's generate(). `model`: a SinkModel of the llada2 family (its `family.ops.window_logits`).

    input_ids (1, P); trace: a path or TraceWriter to record every step; hook: a step hook or a list;
    capture: what to record (default when tracing: received + masked/unmasked split).
    """
    c = config
    r = start(model, input_ids, attention_mask, c, "llada2")
    x, P, bl = r.x, r.P, c.block_length
    n_steps = min(c.steps, c.gen_length // c.minimal_topk)
    schedule = spread(bl, n_steps)  # the quota when too few pass the threshold
    num_blocks = x.shape[1] // bl
    with steps(model, capture, trace, hook, name="llada2", args=r.args, input_ids=r.input_ids, seq_len=x.shape[1],
               layout=r.layout, total=(num_blocks - P // bl) * n_steps, progress=progress, layout_to_hooks=True) as run:
        for b in range(P // bl, num_blocks):
            end = (b + 1) * bl
            win = x[:, :end]  # a view: commits land in x
            for i in range(n_steps):
                active = win[0, -bl:] == r.mask_id  # (bl,)
                if not bool(active.any()):
                    break  # the block finished early
                masked, logits = window_forward(model, run, win, r.mask_id, bl)  # logits (1, end, V)
                x0, x0_p = sample_tokens(logits[:, -bl:], c.temperature, c.top_k, c.top_p)  # (1, bl) each
                confidence = torch.where(active, x0_p[0], -torch.inf)
                commit = commit_masked(confidence, active, c.threshold, schedule[i])  # (bl,)
                win[0, -bl:][commit] = x0[0][commit]
                run.step(win, masked, logits, on_canvas(commit, end), after=x, block=(end - bl, end),
                         attention_mask=torch.ones_like(masked))
                if c.eos_early_stop and bool((x0[0][commit] == r.eos_id).any()):
                    eos = (win[0] == r.eos_id).nonzero()  # the first end token of the window, prompt included
                    if len(eos) and bool((win[0, P:int(eos[0])] != r.mask_id).all()):
                        return run.output(torch.cat([x[:, :P], x[:, P:int(eos[0]) + 1]], dim=1))
            if bool((x[0, P:end] == r.eos_id).any()):
                break  # an end token was generated: no further block
    return run.output(official_return(x, P, c.gen_length, r.eos_id))
