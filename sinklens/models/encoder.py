"""Encoders (BERT, ModernBERT, ...): any transformers masked-LM architecture, loaded headless,
bidirectional, no sampler loop.

An encoder reads its input in one forward pass, so its "sampler" is a single capture step
(`sinklens.samplers.encoder`): a trace with one step whose queries are all real positions,
analysed and reported like any DLM step. Checkpoints load into the headless base class transformers
maps their model_type to (`BertModel`, `ModernBertModel`, ...; the family is named after the
model_type); a masked-LM head in the checkpoint (`cls.*`, `head.*`, `decoder.*`) is not
needed for attention and is dropped, everything else is loaded strictly.

Special ids come from the tokenizer: mask = [MASK], eos = [SEP], pad = [PAD]; [CLS] is written
to the trace as `bos_id` by the encoder sampler, so the analysis counts [CLS] and [SEP] as
special tokens (the classic encoder sinks).
"""
from __future__ import annotations

from typing import Any

import transformers
from transformers.models.auto.modeling_auto import MODEL_FOR_MASKED_LM_MAPPING_NAMES, MODEL_MAPPING_NAMES

from .arm import is_causal_lm
from .families import SpecialTokens, all_ids, first_id, register_generic_family

# Masked-LM / pretraining heads a headless encoder does not need (dropped, not an error).
HEAD_KEYS = r"^(cls\.|head\.|decoder\.|lm_head\.|bert\.pooler\.|pooler\.)"


def encoder_special_tokens(config: dict, tokenizer: Any) -> SpecialTokens:
    tok = tokenizer
    mask = getattr(tok, "mask_token_id", None)
    sep = getattr(tok, "sep_token_id", None)
    pad = config.get("pad_token_id", getattr(tok, "pad_token_id", None))
    return SpecialTokens(mask_id=mask, eos_id=first_id(sep), pad_id=first_id(pad), eot_id=None,
                         stop_ids=all_ids(sep) if sep is not None else ())


def is_encoder(config: dict) -> bool:
    """A config of an architecture transformers ships a masked-LM class for, saved as anything but
    a causal LM (BERT's BertLMHeadModel is a decoder)."""
    return config.get("model_type") in MODEL_FOR_MASKED_LM_MAPPING_NAMES and not is_causal_lm(config)


ENCODER = register_generic_family(
    MODEL_MAPPING_NAMES,  # the headless base class (BertModel, ModernBertModel, ...)
    name="encoder",
    is_diffusion=False,
    sampler="encoder",
    model_class=transformers.AutoModel,  # replaced per checkpoint by for_config
    matches=is_encoder,
    special_tokens=encoder_special_tokens,
    padding="key_padding",  # absolute / RoPE positions 0..S-1, pads masked as keys
    attention="bidirectional",
    ignored_keys=HEAD_KEYS,
)
