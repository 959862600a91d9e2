"""Encoders (BERT, ModernBERT): transformers-native, bidirectional, no sampler loop.

An encoder reads its input in one forward pass, so its "sampler" is a single capture step
(`sinklens.samplers.encoder`): a trace with one step whose queries are all real positions,
analysed and reported like any DLM step. Checkpoints load into the headless `BertModel` /
`ModernBertModel`; a masked-LM head in the checkpoint (`cls.*`, `head.*`, `decoder.*`) is not
needed for attention and is dropped, everything else is loaded strictly.

Special ids come from the tokenizer: mask = [MASK], eos = [SEP], pad = [PAD]; [CLS] is written
to the trace as `bos_id` by the encoder sampler, so the analysis counts [CLS] and [SEP] as
special tokens (the classic encoder sinks).
"""
from __future__ import annotations

from typing import Any

from transformers import BertConfig, BertModel, ModernBertConfig, ModernBertModel

from .families import Family, SpecialTokens, all_ids, architectures, first_id, register_family

# Masked-LM / pretraining heads a headless encoder does not need (dropped, not an error).
HEAD_KEYS = r"^(cls\.|head\.|decoder\.|bert\.pooler\.|pooler\.)"


def encoder_special_tokens(config: dict, tokenizer: Any) -> SpecialTokens:
    tok = tokenizer
    mask = getattr(tok, "mask_token_id", None)
    sep = getattr(tok, "sep_token_id", None)
    pad = config.get("pad_token_id", getattr(tok, "pad_token_id", None))
    return SpecialTokens(mask_id=mask, eos_id=first_id(sep), pad_id=first_id(pad), eot_id=None,
                         stop_ids=all_ids(sep) if sep is not None else ())


def _encoder(name: str, model_class, config_class) -> Family:
    def matches(config: dict) -> bool:  # model_type, or any BertModel / BertForMaskedLM / ... architecture
        return config.get("model_type") == name or any(a.startswith(name) for a in architectures(config))

    return register_family(
        Family(
            name=name,
            is_diffusion=False,
            sampler="encoder",
            model_class=model_class,
            matches=matches,
            build_config=lambda config: config_class.from_dict(config),
            special_tokens=encoder_special_tokens,
            key_mapping=None,
            padding="key_padding",  # absolute / RoPE positions 0..S-1, pads masked as keys
            attention="bidirectional",
            ignored_keys=HEAD_KEYS,
        )
    )


BERT = _encoder("bert", BertModel, BertConfig)
MODERNBERT = _encoder("modernbert", ModernBertModel, ModernBertConfig)
