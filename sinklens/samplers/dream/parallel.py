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

from sinklens.samplers.capture import CaptureOptions
from sinklens.samplers.dream.config import DreamConfig
from sinklens.samplers.dream.draw import sample_tokens
from sinklens.samplers.kvcache import fast_start
from sinklens.samplers.steps import GenerateOutput, attention_is_causal, steps
from sinklens.trace.layout import TraceLayout


@torch.no_grad()
def sample_parallel(model, input_ids, config: DreamConfig, attention_mask=None, *, trace=None, hook=None,
                    capture: CaptureOptions | None = None, progress: bool = False) -> GenerateOutput:
    """Fast-dLLM's uncached threshold decoding of Dream (see the module docstring). input_ids (1, P)."""
    c = config
    x, input_ids, mask_id, args, P, S = fast_start(
        model, input_ids, attention_mask, c, c.max_new_tokens, f"threshold={c.threshold!r}",
        one_prompt="batch 1, as Fast-dLLM's code", padding_why="Fast-dLLM's Dream ignores position shifts",
        needs_bidirectional=False)
    if c.max_new_tokens % c.steps:
        raise ValueError(f"threshold={c.threshold!r} without a cache needs max_new_tokens ({c.max_new_tokens}) to be "
                         f"a multiple of steps ({c.steps}), as Fast-dLLM asserts")
    device = x.device
    layout = TraceLayout(causal=attention_is_causal(model), prompt_length=P)
    real = torch.ones_like(x, dtype=torch.bool)
    quota, carried = c.max_new_tokens // c.steps, 0
    planned, i = c.steps, 0
    with steps(model, capture, trace, hook, name="dream", args=args, input_ids=input_ids, seq_len=S, layout=layout,
               total=c.steps, progress=progress) as run:
        while i < planned:
            mask_index = x == mask_id  # (1, S)
            req = run.request(x, mask_index, real, queries=real)
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
            if i == planned - 1 and carried:  # the last step turned positions down: one more step, quota 0
                quota, planned = 0, planned + 1
            x[transfer] = candidates[transfer]
            run.step(x, mask_index, logits.float(), transfer, after=x, attention_mask=real)
            i += 1
    return run.output(x)
