"""Autoregressive models (ARMs) with native transformers classes: Llama and Qwen2 families.

Llama-3.x, SmolLM2 (Llama architecture) and Qwen2/2.5 load as they are; only the family
adapter (special tokens, sampler name, causal) is added. They stay causal.
"""
from __future__ import annotations

from functools import partial

from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from .families import Family, architectures, register_family, special_tokens_from

# End-of-turn tokens of the chat formats these families use (Llama 3, ChatML).
EOT_TOKENS = ("<|eot_id|>", "<|im_end|>")


def _matches(model_type: str, arch: str):
    def matches(config: dict) -> bool:
        return config.get("model_type") == model_type or arch.lower() in architectures(config)

    return matches


def _arm(name: str, model_class, config_class) -> Family:
    return register_family(
        Family(
            name=name,
            is_diffusion=False,
            sampler="arm",
            model_class=model_class,
            matches=_matches(name, model_class.__name__),
            build_config=lambda config: config_class.from_dict(config),
            special_tokens=partial(special_tokens_from, mask_token=None, eot_tokens=EOT_TOKENS),
            key_mapping=None,
            # Left padding as transformers' generate does it: positions cumsum(mask) - 1.
            padding="shift_positions",
            shifted_logits=True,
            attention="causal",
        )
    )


LLAMA = _arm("llama", LlamaForCausalLM, LlamaConfig)
QWEN2 = _arm("qwen2", Qwen2ForCausalLM, Qwen2Config)
