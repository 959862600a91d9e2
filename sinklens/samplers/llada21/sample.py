"""LLaDA2.1 sampler, step for step the `generate()` of the official LLaDA2.1 model file.

LLaDA2.0's block diffusion (sinklens/samplers/llada2/sample.py: the same canvas, window and
block-causal mask) with two changes per step:

- mask-to-token: every masked position of the block with confidence > `threshold` commits, or,
  when fewer than `num_to_transfer` do, the `num_to_transfer` most confident (a fixed count; no
  schedule, and `steps` is unused);
- token-to-token editing: an unmasked, non-prompt position of the block whose freshly sampled
  token differs from the current one and whose confidence > `editing_threshold` is rewritten
  (the step's `edited` flag). So "is masked" is no longer the only change: a committed token can
  change again.

A block runs until a step has no mask left *before* its forward and edits nothing, or until
`max_post_steps` further steps have run past the last mask. After a block, with
`eos_early_stop`, the run stops once the generated part holds no mask and an end token.

Not kept: at temperature 0 a step that changes no token while masks remain (nothing above
`threshold` with `num_to_transfer=0`, or the mask id as the argmax) would repeat forever, as the
official loop does; here it is a ValueError.

Kept from the official code: the mask check happens before the forward, so a block whose last
mask is committed at step t runs at least one more step (its edits, if any, count); greedy is
the argmax of the logits. Decided here: `editing_threshold=None` turns editing off (the
official code raises a TypeError comparing against None); `sequences` is the prompt followed
by the official return value (the tokens after the prompt, cut after the first end token).
"""
from __future__ import annotations

import torch

from sinklens.samplers.capture import CaptureOptions
from sinklens.samplers.llada2.sample import (commit_masked, official_return, on_canvas, sample_tokens, start,
                                             window_forward)
from sinklens.samplers.llada21.config import LLaDA21Config
from sinklens.samplers.steps import GenerateOutput, steps


def edits(x0: torch.Tensor, x0_p: torch.Tensor, old: torch.Tensor, editable: torch.Tensor,
          editing_threshold: float | None) -> torch.Tensor:
    """(L,) bool positions to rewrite: editable (unmasked, not prompt), confidence > editing_threshold,
    and a token different from the current one. None = no editing."""
    if editing_threshold is None:
        return torch.zeros_like(editable)
    return (x0_p > editing_threshold) & editable & (x0 != old)


@torch.no_grad()
def sample(model, input_ids, config: LLaDA21Config, attention_mask=None, *, trace=None, hook=None,
           capture: CaptureOptions | None = None, progress: bool = False) -> GenerateOutput:
    """LLaDA2.1's generate(). `model`: a SinkModel of the llada2 family (its `family.ops.window_logits`).

    input_ids (1, P); trace: a path or TraceWriter to record every step (with the `edited` column);
    hook: a step hook or a list; capture: what to record (default when tracing: received + the
    masked/unmasked split).
    """
    c = config
    r = start(model, input_ids, attention_mask, c, "llada21")
    x, P, bl = r.x, r.P, c.block_length
    num_blocks = x.shape[1] // bl
    with steps(model, capture, trace, hook, name="llada21", args=r.args, input_ids=r.input_ids, seq_len=x.shape[1],
               layout=r.layout, total=0, progress=progress, layout_to_hooks=True) as run:  # the step count is not known ahead
        for b in range(P // bl, num_blocks):
            end, begin = (b + 1) * bl, b * bl
            win = x[:, :end]  # a view: commits land in x
            is_prompt = torch.arange(begin, end, device=x.device) < P  # (bl,) prompt positions of the block
            post_steps = 0
            while True:
                old = win[0, -bl:].clone()
                active = old == r.mask_id  # (bl,)
                if not bool(active.any()):
                    post_steps += 1
                if post_steps > c.max_post_steps:
                    break
                masked, logits = window_forward(model, run, win, r.mask_id, bl)  # logits (1, end, V)
                x0, x0_p = sample_tokens(logits[:, -bl:], c.temperature, c.top_k, c.top_p, greedy_on_logits=True)
                x0, x0_p = x0[0], x0_p[0]  # (bl,)
                commit = torch.zeros_like(active)
                if bool(active.any()):
                    commit = commit_masked(torch.where(active, x0_p, -torch.inf), active, c.threshold,
                                           c.num_to_transfer)
                edit = edits(x0, x0_p, old, ~active & ~is_prompt, c.editing_threshold)
                change = commit | edit
                win[0, -bl:][change] = x0[change]
                if c.temperature == 0 and bool(active.any()) and torch.equal(win[0, -bl:], old):
                    # same canvas, same greedy tokens: every later step would repeat this one
                    raise ValueError(f"llada21: a greedy step changed no token while {int(active.sum())} masks remain "
                                     f"(the official generate() loops forever here): lower threshold or set "
                                     f"num_to_transfer >= 1")
                run.step(win, masked, logits, on_canvas(commit, end), after=x, grow=True, block=(end - bl, end),
                         attention_mask=torch.ones_like(masked), edited=on_canvas(edit, end))
                if not bool(active.any()) and not bool(edit.any()):
                    break
            if c.eos_early_stop:
                generated = x[0, P:end]
                if not bool((generated == r.mask_id).any()) and bool((generated == r.eos_id).any()):
                    break
    return run.output(official_return(x, P, c.gen_length, r.eos_id))
