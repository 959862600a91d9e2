"""Dream sampler, step for step Dream's `diffusion_generate` (generation_utils.py, `_sample`).

The whole canvas (prompt + max_new_tokens masks) is denoised over `steps` steps on the time
grid linspace(1, time_eps, steps + 1) (Dream's `eps`). The model predicts token i from hidden
state i - 1, so the logits are shifted right by one (position 0 keeps its own). Algorithms:
- `origin`: every masked position is revealed with probability 1 - s/t (all at the last step);
- `maskgit_plus` / `topk_margin` / `entropy`: confidence = top-1 probability / top-1 minus
  top-2 probability / negative entropy; the `int(n_masked * (1 - s/t))` most confident masked
  positions are revealed (all at the last step), or sampled with softmax(conf / alg_temp).

Kept from the official code on purpose (it decides which tokens come out):
- the token draw and the confidences in the dtype of the model's logits (bfloat16 in a bfloat16
  model: top-p's cumulative sum, the softmax and the confidences round there, ties included);
- n_masked is the masked count *averaged over the batch*, computed in float32. With rows of
  different mask counts a row may get more or fewer reveals than it has masks; top-k may then
  pick non-masked positions and write the mask id over them. This is reproduced for exactness.
- RNG order per step: `origin` draws `rand` over all masked positions of the batch (row-major)
  and then, if temperature > 0, the categorical sample; the others draw the categorical sample
  (temperature > 0) and then `multinomial` (alg_temp > 0).
- a categorical sample that fails (invalid probabilities) falls back to the argmax.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from sinklens.samplers.capture import CaptureOptions
from sinklens.samplers.dream.config import DreamConfig
from sinklens.samplers.dream.draw import CONFIDENCE, sample_tokens
from sinklens.samplers.dream.fast import sample_fast
from sinklens.samplers.dream.parallel import sample_parallel
from sinklens.samplers.schedules import linear_time
from sinklens.samplers.steps import GenerateOutput, attention_is_causal, check_inputs, mask_id_of, steps
from sinklens.trace.layout import TraceLayout


@torch.no_grad()
def sample(model, input_ids, config: DreamConfig, attention_mask=None, *, trace=None, hook=None,
           capture: CaptureOptions | None = None, progress: bool = False) -> GenerateOutput:
    """Dream's diffusion_generate(). `model` is a SinkModel (forward_logits returns raw, unshifted logits)."""
    c = config
    if c.cache != "none" or c.threshold is not None:  # Fast-dLLM: cached blocks (fast.py), else parallel.py
        run = sample_fast if c.cache != "none" else sample_parallel
        return run(model, input_ids, c, attention_mask, trace=trace, hook=hook, capture=capture, progress=progress)
    max_new_tokens, time_eps, alg, alg_temp = c.max_new_tokens, c.time_eps, c.alg, c.alg_temp
    temperature, top_p, top_k = c.temperature, c.top_p, c.top_k
    mask_id = mask_id_of(model, c)
    args = {**c.to_dict(), "mask_id": mask_id}
    P = torch.as_tensor(input_ids).shape[-1]
    input_ids, attention_mask = check_inputs(input_ids, attention_mask, P + max_new_tokens,
                                                  getattr(model, "max_length", None))
    B, S = input_ids.shape[0], P + max_new_tokens
    device = input_ids.device


    x = F.pad(input_ids, (0, max_new_tokens), value=mask_id)  # (B, S)
    if attention_mask is not None and torch.any(attention_mask == 0):
        attention_mask = F.pad(attention_mask, (0, max_new_tokens), value=1)  # the masks are real tokens
        position_ids = model.position_ids_for(attention_mask)  # left padding: the family's rule
        real = attention_mask.bool()
    else:
        attention_mask = position_ids = None
        real = torch.ones_like(x, dtype=torch.bool)
    timesteps = torch.linspace(1, time_eps, c.steps + 1, device=device)  # float32, as the official grid
    dtype = getattr(model, "dtype", torch.float32)  # the token draw runs in the model's logits dtype (official)

    layout = TraceLayout(causal=attention_is_causal(model), prompt_length=P)
    with steps(model, capture, trace, hook, name="dream", args=args, input_ids=input_ids, seq_len=S, layout=layout,
               total=c.steps, progress=progress) as run:
        for i in range(c.steps):
            mask_index = x == mask_id  # (B, S)
            req = run.request(x, mask_index, real, queries=real)
            raw = model.forward_logits(x, attention_mask=attention_mask, position_ids=position_ids,
                                       attention=req).to(dtype)  # exact: float32 copies of the model's logits
            logits = torch.cat([raw[:, :1], raw[:, :-1]], dim=1)  # (B, S, V): position j predicted from j - 1
            mask_logits = logits[mask_index]  # (N_masked, V) row-major over the batch
            t, s = timesteps[i], timesteps[i + 1]
            if alg == "origin":
                p_transfer = 1 - s / t if i < c.steps - 1 else 1
                x0 = torch.full_like(x[mask_index], mask_id)  # (N_masked,)
                chosen = torch.rand(*x0.shape, device=device) < p_transfer
                _, x0[chosen] = sample_tokens(mask_logits[chosen], temperature, top_p, top_k)
                transfer = torch.zeros_like(mask_index)
                transfer[mask_index] = chosen
                x[mask_index] = x0.clone()
            else:
                conf, x0 = sample_tokens(mask_logits, temperature, top_p, top_k, confidence=CONFIDENCE[alg])
                n_masked = mask_index.sum() / mask_index.shape[0]  # float32 batch average (official)
                n_transfer = linear_time(n_masked, t, s, last=i == c.steps - 1)
                full_conf = torch.full_like(x, -torch.inf, dtype=logits.dtype)  # (B, S)
                full_conf[mask_index] = conf
                transfer = torch.zeros_like(mask_index)
                if n_transfer > 0:
                    if alg_temp is None or alg_temp == 0:
                        _, idx = torch.topk(full_conf, n_transfer)  # (B, n_transfer)
                    else:
                        idx = torch.multinomial(F.softmax(full_conf / alg_temp, dim=-1), num_samples=n_transfer)
                    candidates = torch.full_like(x, mask_id)
                    candidates[mask_index] = x0.clone()
                    rows = torch.arange(B, device=device)[:, None].expand_as(idx)
                    x[rows, idx] = candidates[rows, idx]
                    transfer[rows, idx] = True
            run.step(x, mask_index, logits.float(), transfer, after=x, attention_mask=real)
    return run.output(x)
