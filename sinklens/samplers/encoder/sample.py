"""Encoders (BERT, ModernBERT): one forward pass, recorded as a trace with one step.

There is nothing to sample: the "generation" is the input itself. Step 0's queries are all
real positions (bidirectional), its `is_masked` marks the input's [MASK] tokens, so the
masked/unmasked query split of a DLM step applies unchanged to a masked-LM input; [CLS] is
written as `bos_id` so the analysis counts it (with [SEP] = eos, [PAD]) among special tokens.
"""
from __future__ import annotations

import torch

from sinklens.samplers import base
from sinklens.samplers.encoder.config import EncoderConfig
from sinklens.trace.layout import TraceLayout


@torch.no_grad()
def sample(model, input_ids, config: EncoderConfig, attention_mask=None, *, trace=None, hook=None,
           capture: base.CaptureOptions | None = None, progress: bool = False) -> base.GenerateOutput:
    """One capture step of an encoder. input_ids (B, S) with its special tokens ([CLS] ... [SEP]);
    attention_mask (B, S) for padded batches. `sequences` is the input, `history` holds it once."""
    input_ids, attention_mask = base.check_inputs(input_ids, attention_mask, torch.as_tensor(input_ids).shape[-1],
                                                  getattr(model, "max_length", None))
    hooks, capture = base.setup_hooks(hook, trace, capture, diffusion=True)
    cls_id = getattr(getattr(model, "tokenizer", None), "cls_token_id", None)
    # the whole input is read at once: no prompt / answer split, every real row is a query
    layout = TraceLayout(causal=base.attention_is_causal(model), prompt_length=None, query_rows="all")
    writer = base.open_trace_writer(trace, model, "encoder", config.to_dict(), input_ids, capture, input_ids.shape[1],
                                    layout=layout, extra={"bos_id": cls_id})
    all_hooks = base.Hooks(hooks.hooks + ([writer] if writer is not None else []))

    real = torch.ones_like(input_ids, dtype=torch.bool) if attention_mask is None else attention_mask.bool()  # (B, S)
    mask_id = getattr(model, "mask_id", None)
    is_masked = input_ids == mask_id if mask_id is not None else torch.zeros_like(real)  # (B, S)
    with base.run_context(writer, trace, 1, progress, "encoder") as bar:
        hook_req = all_hooks.before_step(0, input_ids, is_masked, real)
        groups = base.masked_unmasked_groups(is_masked, real) if capture is not None and capture.query_groups else None
        req = base.build_request(hook_req, capture, 0, real, groups)
        hidden = model.encode(input_ids, attention_mask, attention=req)  # (B, S, D)
        if all_hooks:
            all_hooks.after_step(base.StepEvent(step=0, tokens=input_ids, is_masked=is_masked,
                                                revealed=torch.zeros_like(real), logits=hidden, attention=req,
                                                attention_mask=real,
                                                query_positions=[torch.nonzero(r).squeeze(1) for r in real]))
        if bar is not None:
            bar.update(1)
    return base.GenerateOutput(sequences=input_ids, history=[input_ids.clone()], num_steps=1,
                               trace_path=None if writer is None else writer.path)
