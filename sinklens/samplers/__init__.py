"""The official samplers of each family, with per-step hooks and trace capture (docs/samplers.md).

A sampler is one package of this package: `config.py` holds its config dataclass (torch-free),
`sample.py` its `sample(model, input_ids, config, ...)` (e.g. `llada/`: `LLaDAConfig` + `sample`);
the config registers itself by name with the registry in `sinklens.samplers.registry` (`SAMPLERS`,
`get_config`, `get_sample`), which imports every sampler's config module on its first read.
`generate(model, input_ids, ...)` picks the model family's sampler (`model.family.sampler`:
"llada" for LLaDA and MMaDA, "dream", "arm" for causal models), builds its config from the
official argument names over the defaults the length policy gives the model
(`sinklens.samplers.lengths`) and runs it; `SinkModel.generate` calls it.
"""
from __future__ import annotations

import warnings
from typing import TYPE_CHECKING

from sinklens.samplers import lengths
from sinklens.samplers.registry import SAMPLERS, SamplerConfig, get_config, get_sample

if TYPE_CHECKING:
    from sinklens.samplers.capture import CaptureOptions
    from sinklens.samplers.hooks import StepEvent
    from sinklens.samplers.steps import GenerateOutput


def __getattr__(name: str):
    # these need torch; importing the configs (the command line's --help) must not
    homes = {"CaptureOptions": "capture", "GenerateOutput": "steps", "StepEvent": "hooks"}
    if name in homes:
        import importlib

        return getattr(importlib.import_module(f"sinklens.samplers.{homes[name]}"), name)
    raise AttributeError(f"module 'sinklens.samplers' has no attribute {name!r}")


def generate(model, input_ids, attention_mask=None, *, trace=None, hook=None, capture=None, progress: bool = False,
             config: SamplerConfig | None = None, sampler: str | None = None, **sampler_kwargs) -> GenerateOutput:
    """Run a sampler (default: the model family's). Either `config` (a sampler config) or the
    official argument names as keywords: LLaDA/MMaDA steps, gen_length, block_length, temperature,
    cfg_scale, remasking, mask_id, logits_eos_inf, confidence_eos_eot_inf; Dream steps,
    max_new_tokens, time_eps (Dream's eps), alg, alg_temp, temperature, top_p, top_k, mask_id; ARM
    max_new_tokens, do_sample, temperature, top_p, top_k, eos_token_id; LLaDA2.0 gen_length, block_length,
    steps, threshold, minimal_topk, eos_early_stop, ... (LLaDA2.1: sampler="llada21", plus editing_threshold,
    max_post_steps, num_to_transfer) (see each sampler's config).
    Arguments left out take the official defaults, except on a sinklens-trained model (its training
    settings) and where the length does not fit the model's context (cut to fit, with a warning);
    see `sinklens.samplers.lengths`."""
    import torch

    if isinstance(input_ids, (str, bytes)):
        raise TypeError("input_ids must be token ids (a list or a (B, P) tensor), got text: tokenize it first, "
                        "m.apply_chat_template(text) or m.tokenizer.encode(text)")
    if config is not None:
        if sampler_kwargs:
            raise TypeError(f"pass either config= or sampler arguments, not both (got {sorted(sampler_kwargs)})")
        if sampler is not None and sampler != config.name:
            raise ValueError(f"sampler={sampler!r} but config is a {type(config).__name__} ({config.name!r})")
        name = config.name
    else:
        name = sampler or model.family.sampler
        plan = lengths.settings(get_config(name), lengths.ModelFacts.of(model), overrides=sampler_kwargs,
                                prompt_length=torch.as_tensor(input_ids).shape[-1], fallback="official", flags=False)
        for line in plan.deprecated:
            warnings.warn(line, FutureWarning, stacklevel=3)
        for line in plan.notes:
            warnings.warn(line, stacklevel=3)
        config = plan.config()
    device = getattr(model, "device", None)
    input_ids = torch.as_tensor(input_ids)
    if device is not None:
        input_ids = input_ids.to(device)
        attention_mask = None if attention_mask is None else torch.as_tensor(attention_mask).to(device)
    out = get_sample(name)(model, input_ids, config, attention_mask, trace=trace, hook=hook, capture=capture,
                           progress=progress)
    if getattr(model, "tokenizer", None) is not None:
        from sinklens.samplers.steps import decode_new

        P = input_ids.shape[-1]
        out.text = [decode_new(model, row[P:].tolist()) for row in out.sequences]
    return out


__all__ = ["CaptureOptions", "GenerateOutput", "StepEvent", "SAMPLERS", "SamplerConfig", "generate", "get_config",
           "get_sample"]
