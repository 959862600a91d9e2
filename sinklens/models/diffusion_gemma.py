"""DiffusionGemma -> transformers' own DiffusionGemmaForBlockDiffusion (transformers >= 5.13).

DiffusionGemma is an encoder-decoder over one set of weights: a *causal* encoder writes the
prefix (prompt, then every finished canvas) into a KV cache; a *bidirectional* decoder denoises a
canvas of `canvas_length` tokens that attends to that cache and to itself. Its canvas starts
as uniformly random tokens (there is no mask token). Layers alternate sliding-window and global
attention: in the encoder the window is in the mask; in the decoder it is in the cache (a
sliding layer's cache keeps only the last window of the prefix), so a canvas query of a sliding
layer sees fewer keys than one of a global layer. Global layers share K = V (no v_proj) and
every layer uses `scaling = 1.0` (q/k are RMS-normalised), not 1/sqrt(d).

The class is native, so nothing is mapped: the config is the checkpoint's, parameters keep their
names. The sampler is `sinklens.samplers.diffusion_gemma`; the two forward passes it needs are
here (`encode_prefix`, `denoise`, ...) and reach the sampler as `model.family.ops`, so the
sampler never reaches into the model's modules (nor imports this higher layer).
"""
from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import torch
from transformers import DiffusionGemmaConfig, DiffusionGemmaForBlockDiffusion

from .families import Family, SpecialTokens, all_ids, first_id, register_family


def is_diffusion_gemma(config: dict) -> bool:
    return config.get("model_type") == "diffusion_gemma" or "DiffusionGemmaForBlockDiffusion" in (
        config.get("architectures") or [])


def special_tokens(config: dict, tokenizer: Any) -> SpecialTokens:
    """No mask token (the canvas is random tokens). EOS: the top-level list (the hub checkpoints
    ship [1, 106] = <eos>, <turn|>), else the text config's, else the tokenizer's; pad likewise."""
    text = config.get("text_config") or {}
    eos = config.get("eos_token_id", text.get("eos_token_id", getattr(tokenizer, "eos_token_id", None)))
    pad = text.get("pad_token_id", getattr(tokenizer, "pad_token_id", None))
    # Gemma 4's end of turn is <turn|> (id 106; transformers' gguf loader lists it among Gemma 4's EOS ids)
    eot = tokenizer.get_vocab().get("<turn|>") if tokenizer is not None else None
    return SpecialTokens(mask_id=None, eos_id=first_id(eos), pad_id=first_id(pad), eot_id=eot, stop_ids=all_ids(eos, eot))


def _kwargs(attention) -> dict:
    return {} if attention is None else {"sinklens": attention}


@torch.no_grad()
def encode_prefix(m, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor, cache,
                  attention=None) -> None:
    """Causal encoder pass over the uncached prefix tokens (B, S_new), appending to `cache`.

    attention_mask (B, S_cached + S_new) bool over every prefix position so far; position_ids
    (1, S_new) absolute positions.
    """
    model = m.model
    encoder = model.model.encoder
    dummy = torch.empty((input_ids.shape[0], input_ids.shape[1], 0), dtype=model.dtype, device=input_ids.device)
    masks = encoder.create_masks_for_generate(config=model.config, inputs_embeds=dummy, attention_mask=attention_mask,
                                              past_key_values=cache, position_ids=position_ids)
    encoder(input_ids=input_ids, attention_mask=masks, past_key_values=cache, position_ids=position_ids,
            **_kwargs(attention))


def decoder_masks(m, canvas: torch.Tensor, cache, attention_mask: torch.Tensor) -> dict:
    """The decoder's per-layer-type masks: every canvas query sees every cached real key and the
    whole canvas (None = no padding: nothing to mask). attention_mask (B, S_prefix + C) bool."""
    model = m.model
    return model.model.decoder.create_diffusion_decoder_attention_mask(
        config=model.config, inputs_embeds=canvas.unsqueeze(-1), past_key_values=cache,
        decoder_attention_mask=attention_mask)


@torch.no_grad()
def denoise(m, canvas: torch.Tensor, self_conditioning: torch.Tensor | None, masks: dict, cache,
            position_ids: torch.Tensor, attention=None) -> torch.Tensor:
    """Decoder pass over the canvas (B, C): logits (B, C, V) float32, soft-capped as the model's own."""
    # hidden-state readouts and the lens read the decoder's layers (get_decoder()): the canvas rows
    out = m.run_model(attention, decoder_input_ids=canvas, self_conditioning_logits=self_conditioning,
                      decoder_attention_mask=masks, past_key_values=cache, decoder_position_ids=position_ids)
    return out.logits


def new_cache(m):
    """An empty KV cache laid out like the model's layers (sliding layers keep only their window)."""
    from transformers import DynamicCache

    return DynamicCache(config=m.model.config.get_text_config(decoder=True))


DIFFUSION_GEMMA = register_family(
    Family(
        name="diffusion_gemma",
        is_diffusion=True,
        sampler="diffusion_gemma",
        model_class=DiffusionGemmaForBlockDiffusion,
        matches=is_diffusion_gemma,
        build_config=lambda config: DiffusionGemmaConfig.from_dict(config),
        special_tokens=special_tokens,
        key_mapping=None,
        padding="key_padding",  # generate(): positions arange(P) with left padding, pads masked as keys
        attention="encoder-decoder",
        ops=SimpleNamespace(encode_prefix=encode_prefix, decoder_masks=decoder_masks, denoise=denoise,
                            new_cache=new_cache),
    )
)
