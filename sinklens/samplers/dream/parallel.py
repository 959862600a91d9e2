"""Fast-dLLM's threshold decoding for Dream without a cache (NVlabs/Fast-dLLM
`dream/model/generation_utils.py`, `_sample` with alg='confidence_threshold'), step for step.

Every step is a forward of the whole canvas (logits shifted right by one, as Dream's). The
masked positions' tokens are drawn (temperature / top-p / top-k; confidence = the drawn token's
probability), and a quota of them is committed: the most confident always, the others of the
quota only when their confidence reaches `threshold`. The quota is the answer's masks / steps
per step, plus the positions the previous step turned down (they carry over).

Kept from the official code on purpose (they decide the output and the step count):
- a last step that turns positions down adds one more step (and the per-step quota drops to 0,
  so later steps commit only what was carried), so a run takes at least `steps` forwards and
  often more (`tests/fixtures/fastdllm`: 4 steps asked, 11 run);
- the answer's mask count must be a multiple of `steps` (the official assertion: a one-line
  error here); one prompt without padding (the official model ignores position shifts).

Trace: one record per forward, every row a query, every key visible (as Dream's own sampler).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from sinklens.samplers import base
from sinklens.samplers.dream.config import DreamConfig
from sinklens.samplers.dream.draw import sample_tokens
from sinklens.samplers.kvcache import check_fast_inputs
from sinklens.trace.layout import TraceLayout


@torch.no_grad()
def sample_parallel(model, input_ids, config: DreamConfig, attention_mask=None, *, trace=None, hook=None,
                    capture: base.CaptureOptions | None = None, progress: bool = False) -> base.GenerateOutput:
    """Fast-dLLM's uncached threshold decoding of Dream (see the module docstring). input_ids (1, P)."""
    c = config
    mask_id = base.mask_id_of(model, c)
    args = {**c.to_dict(), "mask_id": mask_id}
    P = torch.as_tensor(input_ids).shape[-1]
    S = P + c.max_new_tokens
    input_ids, attention_mask = base.check_inputs(input_ids, attention_mask, S, getattr(model, "max_length", None))
    check_fast_inputs(model, input_ids, attention_mask, f"threshold={c.threshold!r}",
                      one_prompt="batch 1, as Fast-dLLM's code",
                      padding_why="Fast-dLLM's Dream ignores position shifts", needs_bidirectional=False)
    if c.max_new_tokens % c.steps:
        raise ValueError(f"threshold={c.threshold!r} without a cache needs max_new_tokens ({c.max_new_tokens}) to be "
                         f"a multiple of steps ({c.steps}), as Fast-dLLM asserts")
    device = model.device
    input_ids = input_ids.to(device)

    hooks, capture = base.setup_hooks(hook, trace, capture, diffusion=True)
    layout = TraceLayout(causal=base.attention_is_causal(model), prompt_length=P)
    writer = base.open_trace_writer(trace, model, "dream", args, input_ids, capture, S, layout=layout)
    all_hooks = base.Hooks(hooks.hooks + ([writer] if writer is not None else []))

    x = F.pad(input_ids, (0, c.max_new_tokens), value=mask_id)  # (1, S)
    real = torch.ones_like(x, dtype=torch.bool)
    quota, carried = c.max_new_tokens // c.steps, 0
    steps, i, history = c.steps, 0, []
    with base.run_context(writer, trace, c.steps, progress, "dream") as bar:
        while i < steps:
            mask_index = x == mask_id  # (1, S)
            groups = base.masked_unmasked_groups(mask_index, real) if capture and capture.query_groups else None
            req = base.build_request(all_hooks.before_step(i, x, mask_index, real), capture, i, real, groups)
            tokens_in = x.clone()
            raw = model.forward_logits(x, attention=req).to(model.dtype)  # (1, S, V) in the logits' dtype (official)
            logits = torch.cat([raw[:, :1], raw[:, :-1]], dim=1)  # position j predicted from j - 1
            confidence, x0 = sample_tokens(logits[mask_index], c.temperature, c.top_p, c.top_k)
            candidates = torch.full_like(x, mask_id)
            candidates[mask_index] = x0
            full = torch.full(x.shape, -torch.inf, dtype=logits.dtype, device=device)
            full[mask_index] = confidence
            n, carried = quota + carried, 0
            values, idx = torch.topk(full, n)
            transfer = torch.zeros_like(mask_index)
            transfer[0, idx[0]] = True
            refused = idx[0, 1:][values[0, 1:] < c.threshold]  # the most confident always commits
            transfer[0, refused] = False
            carried = len(refused)
            if i == steps - 1 and carried:  # the last step turned positions down: one more step, quota 0
                quota, steps = 0, steps + 1
            x[transfer] = candidates[transfer]
            history.append(x.clone())
            if all_hooks:
                all_hooks.after_step(base.StepEvent(step=i, tokens=tokens_in, is_masked=mask_index, revealed=transfer,
                                                    logits=logits.float(), attention=req, attention_mask=real))
            i += 1
            if bar is not None:
                bar.update(1)
    return base.GenerateOutput(sequences=x, history=history, num_steps=i,
                               trace_path=None if writer is None else writer.path)
