"""Autoregressive models (ARMs): any transformers `*ForCausalLM` whose attention runs through
transformers' `AttentionInterface` (Llama, Qwen2/3, Mistral, Gemma2/3, Phi-3, OLMo2, Granite,
gpt-oss, ...).

One generic adapter instead of one per architecture: the class and config come from transformers'
own auto mappings for the checkpoint's `model_type` (the family is named after it: "llama",
"gemma3_text", ...); every attention fact (causal, per-layer sliding windows, scaling, softcapping,
GQA, learned sinks) is read from the config and the modules' calls at run time
(sinklens/attention/function.py). Models whose attention does not go through the interface are
refused at load (loader.check_attention_path). Nothing is mapped: native class, native names.
"""
from __future__ import annotations

from functools import partial

import transformers
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, MODEL_FOR_MASKED_LM_MAPPING_NAMES

from .families import register_generic_family, special_tokens_from

# End-of-turn tokens of the chat formats of these models (Llama 3, ChatML, Gemma, Phi-3).
EOT_TOKENS = ("<|eot_id|>", "<|im_end|>", "<end_of_turn>", "<|end|>")
CAUSAL_LM_CLASSES = frozenset(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values())


def is_causal_lm(config: dict) -> bool:
    """A config of a causal LM transformers ships: its architectures name one (LlamaForCausalLM,
    ...), or, without architectures, its model_type has one and no masked-LM class (BERT has both)."""
    if config.get("dual_modes"):  # a dual checkpoint: block diffusion by default, an ARM by mode="ar" (sdar.py)
        return False
    archs = config.get("architectures") or []
    if archs:
        return any(a in CAUSAL_LM_CLASSES for a in archs)
    model_type = config.get("model_type")
    return model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES and model_type not in MODEL_FOR_MASKED_LM_MAPPING_NAMES


ARM = register_generic_family(
    MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
    name="arm",
    is_diffusion=False,
    sampler="arm",
    model_class=transformers.AutoModelForCausalLM,  # replaced per checkpoint by for_config
    matches=is_causal_lm,
    special_tokens=partial(special_tokens_from, mask_token=None, eot_tokens=EOT_TOKENS),
    # Left padding as transformers' generate does it: positions cumsum(mask) - 1.
    padding="shift_positions",
    shifted_logits=True,
    attention="causal",
)
