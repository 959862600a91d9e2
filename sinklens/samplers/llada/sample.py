"""LLaDA / MMaDA sampler, step for step the `generate()` of LLaDA's repository (generate.py).

Semi-autoregressive blocks; in each block a fixed number of masked positions is revealed per
step (the block's mask count spread evenly, the remainder to the earliest steps); candidates
are the argmax of Gumbel-perturbed logits in float64; confidence is the candidate's softmax
probability (`low_confidence`) or uniform noise (`random`); the top-k are committed.

Kept from the official code on purpose (they decide which tokens come out):
- the arithmetic in the dtype of the model's logits (bfloat16 in a bfloat16 model: CFG's mix and
  the softmax round there, and their ties decide which positions commit);
- the RNG draw order per step: `rand_like` over the float64 (B, S, V) logits for the Gumbel
  noise (only when temperature > 0), then `rand((B, S))` for `random` remasking;
- only positions *after* the current block are excluded from selection (a position of an
  earlier block that still holds the mask id - the sampler may draw the mask id itself - can
  be chosen again);
- `confidence_eos_eot_inf` sets the EOS column of the noisy logits and the EoT column of the
  logits to -inf after the argmax (with temperature 0 both are the same tensor, so both
  columns drop out of the confidence).
Fixed official bugs: `cfg_scale > 0` with `attention_mask=None` (official: UnboundLocalError)
runs as with an all-ones mask; EOS / EoT ids come from the model, not the 8B vocabulary's
126081 / 126348.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from sinklens.samplers.capture import CaptureOptions, repeat_rows, take_rows
from sinklens.samplers.llada.config import LLaDAConfig
from sinklens.samplers.llada.fast import sample_fast
from sinklens.samplers.llada.gumbel import add_gumbel_noise
from sinklens.samplers.schedules import spread_masks
from sinklens.samplers.steps import GenerateOutput, attention_is_causal, check_inputs, mask_id_of, steps
from sinklens.trace.layout import TraceLayout


@torch.no_grad()
def sample(model, input_ids, config: LLaDAConfig, attention_mask=None, *, trace=None, hook=None,
           capture: CaptureOptions | None = None, progress: bool = False) -> GenerateOutput:
    """LLaDA's generate(). `model` is a SinkModel (forward_logits, mask_id, eos_id, eot_id, max_length).

    input_ids (B, P) prompt ids (left-padded batches with `attention_mask` (B, P));
    trace: a path or TraceWriter to record every step; hook: a step hook or a list of them;
    capture: what to record (default when tracing: received + masked/unmasked split).
    """
    c = config
    if c.fast_dllm:  # Fast-dLLM's cached / parallel decoding (fast.py)
        return sample_fast(model, input_ids, c, attention_mask, trace=trace, hook=hook, capture=capture,
                           progress=progress)
    gen_length, block_length, temperature = c.gen_length, c.block_length, c.temperature
    cfg_scale, remasking, logits_eos_inf, confidence_eos_eot_inf = (c.cfg_scale, c.remasking, c.logits_eos_inf,
                                                                    c.confidence_eos_eot_inf)
    num_blocks = c.num_blocks
    mask_id = mask_id_of(model, c)
    args = {**c.to_dict(), "mask_id": mask_id}
    eos_id, eot_id = getattr(model, "eos_id", None), getattr(model, "eot_id", None)
    if logits_eos_inf and eos_id is None:
        raise ValueError("logits_eos_inf=True but the model has no EOS id")
    if confidence_eos_eot_inf and eos_id is None and eot_id is None:
        raise ValueError("confidence_eos_eot_inf=True but the model has neither an EOS nor an EoT id")
    P = torch.as_tensor(input_ids).shape[-1]
    input_ids, attention_mask = check_inputs(input_ids, attention_mask, P + gen_length,
                                                  getattr(model, "max_length", None))
    steps_per_block = c.steps // num_blocks
    device = input_ids.device
    # The official sampler computes in the dtype of the model's logits (CFG, softmax: bfloat16 in a bfloat16
    # model); forward_logits returns them as float32, exactly, and they go back without rounding.
    dtype = getattr(model, "dtype", torch.float32)
    B = input_ids.shape[0]

    layout = TraceLayout(causal=attention_is_causal(model), prompt_length=P,
                         block_length=block_length if block_length < gen_length else None)  # one block: None

    x = torch.full((B, P + gen_length), mask_id, dtype=torch.long, device=device)  # (B, S)
    x[:, :P] = input_ids
    if attention_mask is not None:  # the generated part is always real
        attention_mask = torch.cat([attention_mask, torch.ones(B, gen_length, dtype=attention_mask.dtype,
                                                               device=device)], dim=-1)
    real = torch.ones_like(x, dtype=torch.bool) if attention_mask is None else attention_mask.bool()
    prompt_index = x != mask_id  # (B, S) what CFG blanks out (official: every non-mask prompt position)
    with steps(model, capture, trace, hook, name="llada", args=args, input_ids=input_ids, seq_len=P + gen_length,
               layout=layout, total=c.steps, progress=progress) as run:
        for b in range(num_blocks):
            start, end = P + b * block_length, P + (b + 1) * block_length
            schedule = spread_masks(x[:, start:end] == mask_id, steps_per_block)  # (B, steps_per_block)
            for i in range(steps_per_block):
                mask_index = x == mask_id  # (B, S)
                req = run.request(x, mask_index, real, queries=real)
                if cfg_scale > 0.0:
                    un_x = x.clone()
                    un_x[prompt_index] = mask_id
                    am = None if attention_mask is None else torch.cat([attention_mask, attention_mask])
                    both = model.forward_logits(torch.cat([x, un_x]), attention_mask=am,
                                                attention=repeat_rows(req, 2)).to(dtype)  # (2B, S, V)
                    cond, un = torch.chunk(both, 2, dim=0)
                    logits = un + (cfg_scale + 1) * (cond - un)
                    req = take_rows(req, B)
                else:
                    logits = model.forward_logits(x, attention_mask=attention_mask,
                                                  attention=req).to(dtype)  # (B, S, V)

                if logits_eos_inf:
                    logits[:, :, eos_id] = -torch.inf
                noisy = add_gumbel_noise(logits, temperature)
                x0 = noisy.argmax(dim=-1)  # (B, S)
                if confidence_eos_eot_inf:
                    if eos_id is not None:
                        noisy[:, :, eos_id] = -torch.inf
                    if eot_id is not None:
                        logits[:, :, eot_id] = -torch.inf
                if remasking == "low_confidence":
                    p = F.softmax(logits, dim=-1)
                    x0_p = torch.gather(p, -1, x0[..., None]).squeeze(-1)  # (B, S)
                else:  # random
                    x0_p = torch.rand((B, x0.shape[1]), device=x0.device)
                x0_p[:, end:] = -torch.inf  # later blocks wait
                x0 = torch.where(mask_index, x0, x)
                confidence = torch.where(mask_index, x0_p, torch.full_like(x0_p, -torch.inf))
                transfer = torch.zeros_like(x0, dtype=torch.bool)  # (B, S)
                for j in range(B):
                    _, idx = torch.topk(confidence[j], k=int(schedule[j, i]))
                    transfer[j, idx] = True
                x[transfer] = x0[transfer]
                # mask_index and transfer are made for this step alone and never changed after it; x0_p holds
                # the committed tokens' probabilities (low confidence, float32: as the trace stores them)
                probs = x0_p if remasking == "low_confidence" and x0_p.dtype == torch.float32 else None
                run.step(x, mask_index, logits.float(), transfer, after=x, attention=req, block=(start, end),
                         attention_mask=real, fresh=("is_masked", "revealed"), probs=probs)
    return run.output(x, num_steps=c.steps)
