"""The random-init control: a loaded model's weights re-initialised by its class's own init.

A sink measured on trained weights means little until the same readout on untrained weights of
the same shape is beside it (a causal model's first key is a sink under uniform attention too).
`random_init(model, seed)` keeps everything a checkpoint fixes (config, shapes, tied weights,
tokenizer, the family's format) and draws every parameter afresh with transformers' `_init_weights`
of the model's class (normal(0, initializer_range) for linear and embedding weights, ones for
norms, zeros for biases), so the control is what that class is before training.
"""
from __future__ import annotations

import torch


@torch.no_grad()
def random_init(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Re-initialise every weight of `model` (a transformers PreTrainedModel, on the CPU or one
    device, not sharded) in place, deterministically in `seed`; the global torch RNG is left as it was."""
    for x in (*model.modules(), *model.parameters(), *model.buffers()):
        # from_pretrained marks what it loaded as initialised, and transformers' init functions skip those
        if hasattr(x, "_is_hf_initialized"):
            del x._is_hf_initialized
    devices = sorted({p.device.index for p in model.parameters() if p.device.type == "cuda"})
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        model.init_weights()          # the class's own `_init_weights`, module by module, then ties the weights
    return model
