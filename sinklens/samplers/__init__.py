"""The official samplers of each family, with per-step hooks and trace capture (docs/samplers.md).

`generate(model, input_ids, ...)` dispatches on `model.family.sampler` ("llada" for LLaDA and
MMaDA, "dream", "arm" for causal models); `SinkModel.generate` calls it.
"""
from __future__ import annotations

from sinklens.samplers.base import CaptureOptions, GenerateOutput, StepEvent

SAMPLERS = ("llada", "dream", "arm")


def sampler_module(name: str):
    """The module (with a `generate` function) of sampler `name`."""
    if name == "llada":
        from sinklens.samplers import llada as mod
    elif name == "dream":
        from sinklens.samplers import dream as mod
    elif name == "arm":
        from sinklens.samplers import arm as mod
    else:
        raise ValueError(f"unknown sampler {name!r}; known: {list(SAMPLERS)}")
    return mod


def generate(model, input_ids, attention_mask=None, *, trace=None, hook=None, capture=None,
             sampler: str | None = None, **sampler_kwargs) -> GenerateOutput:
    """Run the model family's own sampler. sampler_kwargs use the official argument names:
    LLaDA/MMaDA steps, gen_length, block_length, temperature, cfg_scale, remasking, mask_id,
    logits_eos_inf, confidence_eos_eot_inf; Dream steps, max_new_tokens, eps, alg, alg_temp,
    temperature, top_p, top_k; ARM max_new_tokens, do_sample, temperature, top_p, top_k."""
    import inspect

    import torch

    name = sampler or model.family.sampler
    mod = sampler_module(name)
    allowed = [p for p in inspect.signature(mod.generate).parameters
               if p not in ("model", "input_ids", "attention_mask", "trace", "hook", "capture")]
    unknown = sorted(set(sampler_kwargs) - set(allowed))
    if unknown:
        raise TypeError(f"the {name} sampler got unknown argument(s) {unknown}; it takes {allowed}")
    device = getattr(model, "device", None)
    input_ids = torch.as_tensor(input_ids)
    if device is not None:
        input_ids = input_ids.to(device)
        attention_mask = None if attention_mask is None else torch.as_tensor(attention_mask).to(device)
    return mod.generate(model, input_ids, attention_mask, trace=trace, hook=hook, capture=capture, **sampler_kwargs)


__all__ = ["CaptureOptions", "GenerateOutput", "StepEvent", "SAMPLERS", "generate", "sampler_module"]
