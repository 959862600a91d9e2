"""Dream -> transformers' Qwen2ForCausalLM (run bidirectionally).

Dream-v0 has Qwen2.5-7B's shapes and Qwen2's parameter names (q/k/v with bias), so no key
mapping is needed; only the config is converted. Dream predicts token i from hidden state
i - 1: that shift belongs to its sampler, `forward_logits` returns the raw logits.
"""
from __future__ import annotations

from functools import partial

from transformers import Qwen2Config, Qwen2ForCausalLM

from .families import Family, architectures, decoder_kwargs, register_family, special_tokens_from

MASK_TOKEN = "<|mask|>"
EOT_TOKEN = "<|im_end|>"


def is_dream(config: dict) -> bool:
    return str(config.get("model_type", "")).lower() == "dream" or any("dream" in a for a in architectures(config))


def to_qwen2_config(config: dict) -> Qwen2Config:
    """Dream config.json dict -> Qwen2Config (bidirectional, q/k/v bias, eps from config)."""
    if config.get("use_sliding_window"):
        raise ValueError("Dream config has use_sliding_window=true; sinklens supports full attention only")
    if config.get("rope_scaling"):
        raise ValueError(f"Dream config rope_scaling={config['rope_scaling']!r} is not supported (expected null)")
    qwen = Qwen2Config(intermediate_size=config["intermediate_size"],
                       **decoder_kwargs(config, max_positions=32768, eps=1e-6))
    qwen.is_causal = False  # DLM
    return qwen


DREAM = register_family(
    Family(
        name="dream",
        is_diffusion=True,
        sampler="dream",
        model_class=Qwen2ForCausalLM,
        matches=is_dream,
        build_config=to_qwen2_config,
        special_tokens=partial(special_tokens_from, mask_token=MASK_TOKEN, eot_tokens=(EOT_TOKEN,)),
        key_mapping=None,  # official names are Qwen2's
        padding="shift_positions",  # diffusion_generate: cumsum(mask) - 1, pads -> 1
        mask_pad_queries=True,  # its forward: a pad's row sees no key (sdpa gives it 0)
        shifted_logits=True,  # Dream predicts token i from hidden state i - 1
        tokenizer_fallback="Qwen2Tokenizer",  # the hub's DreamTokenizer is remote code
    )
)
