"""Encoders (BERT, ModernBERT): one forward pass, recorded as a trace with one step.

There is nothing to sample: the "generation" is the input itself. Step 0's queries are all
real positions (bidirectional), its `is_masked` marks the input's [MASK] tokens, so the
masked/unmasked query split of a DLM step applies unchanged to a masked-LM input; [CLS] is
written as `bos_id` so the analysis counts it (with [SEP] = eos, [PAD]) among special tokens.
"""
from __future__ import annotations

import torch

from sinklens.samplers.capture import CaptureOptions
from sinklens.samplers.encoder.config import EncoderConfig
from sinklens.samplers.steps import GenerateOutput, attention_is_causal, check_inputs, steps
from sinklens.trace.layout import TraceLayout


@torch.no_grad()
def sample(model, input_ids, config: EncoderConfig, attention_mask=None, *, trace=None, hook=None,
           capture: CaptureOptions | None = None, progress: bool = False) -> GenerateOutput:
    """One capture step of an encoder. input_ids (B, S) with its special tokens ([CLS] ... [SEP]);
    attention_mask (B, S) for padded batches. `sequences` is the input, `history` holds it once."""
    input_ids, attention_mask = check_inputs(input_ids, attention_mask, torch.as_tensor(input_ids).shape[-1],
                                                  getattr(model, "max_length", None))
    cls_id = getattr(getattr(model, "tokenizer", None), "cls_token_id", None)
    # the whole input is read at once: no prompt / answer split, every real row is a query
    layout = TraceLayout(causal=attention_is_causal(model), prompt_length=None, query_rows="all")

    real = torch.ones_like(input_ids, dtype=torch.bool) if attention_mask is None else attention_mask.bool()  # (B, S)
    mask_id = getattr(model, "mask_id", None)
    is_masked = input_ids == mask_id if mask_id is not None else torch.zeros_like(real)  # (B, S)
    with steps(model, capture, trace, hook, name="encoder", args=config.to_dict(), input_ids=input_ids,
               seq_len=input_ids.shape[1], layout=layout, total=1, progress=progress, extra={"bos_id": cls_id}) as run:
        req = run.request(input_ids, is_masked, real, queries=real)
        hidden = model.encode(input_ids, attention_mask, attention=req)  # (B, S, D)
        run.step(input_ids, is_masked, hidden, torch.zeros_like(real), after=input_ids, attention_mask=real,
                 query_positions=[torch.nonzero(r).squeeze(1) for r in real])
    return run.output(input_ids)
