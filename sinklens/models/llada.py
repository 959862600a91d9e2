"""LLaDA and MMaDA -> transformers' LlamaForCausalLM (run bidirectionally).

LLaDA's official code is an OLMo-derived remote-code model. Its "llama" block is exactly a
Llama decoder layer: RMSNorm, RoPE with the same half-split rotation, SwiGLU MLP where
`ff_proj` is the SiLU-gated branch, `up_proj` multiplies in, and the block's `ff_out` is the
down projection. The top-level `model.transformer.ff_out` is the untied LM head.
MMaDA is trained from LLaDA and keeps its architecture and parameter names (larger vocab).
"""
from __future__ import annotations

from functools import partial

from transformers import LlamaConfig, LlamaForCausalLM

from .families import Family, architectures, config_value, register_family, special_tokens_from

# Official parameter name -> LlamaForCausalLM name. Rules apply one after another in dict
# order, each rule once: `blocks.` -> `layers.` first, and the top-level `ff_out` (LM head)
# before the per-block `ff_out` (down projection). No capture groups: transformers'
# key_mapping only substitutes `\1`.
KEY_MAPPING = {
    r"^model\.transformer\.wte\.": "model.embed_tokens.",
    r"^model\.transformer\.ln_f\.": "model.norm.",
    r"^model\.transformer\.ff_out\.": "lm_head.",
    r"^model\.transformer\.blocks\.": "model.layers.",
    r"\.attn_out\.": ".self_attn.o_proj.",
    r"\.q_proj\.": ".self_attn.q_proj.",
    r"\.k_proj\.": ".self_attn.k_proj.",
    r"\.v_proj\.": ".self_attn.v_proj.",
    r"\.attn_norm\.": ".input_layernorm.",
    r"\.ff_norm\.": ".post_attention_layernorm.",
    r"\.ff_proj\.": ".mlp.gate_proj.",
    r"\.up_proj\.": ".mlp.up_proj.",
    r"\.ff_out\.": ".mlp.down_proj.",
}

MASK_TOKEN = "<|mdm_mask|>"
EOT_TOKEN = "<|eot_id|>"

# Options of LLaDA's config that a Llama decoder cannot express: (key, value Llama needs).
_REQUIRED = {
    "block_type": ("llama",),
    "layer_norm_type": ("rms",),
    "activation_type": ("silu",),
    "alibi": (False, None),
    "rope": (True, None),
    "include_bias": (False, None),
    "include_qkv_bias": (False, None),
    "scale_logits": (False, None),
    "input_emb_norm": (False, None),
    "attention_layer_norm": (False, None),
    "multi_query_attention": (False, None),
    "block_group_size": (1, None),
}


def is_llada(config: dict) -> bool:
    # LLaDA-MoE's hub configs also say model_type "llada": their architecture tells them apart
    # (models/llada_moe.py); so does LLaDA2's `LLaDA2MoeModelLM`.
    if any("moe" in a for a in architectures(config)):
        return False
    return config.get("model_type") == "llada" or any("llada" in a for a in architectures(config))


def is_mmada(config: dict) -> bool:
    mt = str(config.get("model_type", "")).lower()
    # MMaDA's config class adds multimodal keys (llm_vocab_size, new_vocab_size, codebook_size)
    # to LLaDA's; its text model keeps LLaDA's architecture and parameter names.
    multimodal = "d_model" in config and ("llm_vocab_size" in config or "new_vocab_size" in config)
    return mt == "mmada" or any("mmada" in a for a in architectures(config)) or multimodal


def to_llama_config(config: dict) -> LlamaConfig:
    """LLaDA/MMaDA config.json dict -> LlamaConfig (bidirectional)."""
    for key, allowed in _REQUIRED.items():
        if key in config and config[key] not in allowed:
            raise ValueError(
                f"LLaDA config option {key}={config[key]!r} is not supported "
                f"(sinklens maps LLaDA onto Llama, which needs {key} in {list(allowed)})"
            )
    d_model = config["d_model"]
    n_heads = config["n_heads"]
    hidden = config_value(config, "mlp_hidden_size", default=None)
    if hidden is None:
        hidden = config.get("mlp_ratio", 4) * d_model
    tied = bool(config.get("weight_tying", False))
    llama = LlamaConfig(
        # LLaDA's embedding and LM head have `embedding_size` rows (may pad `vocab_size`).
        vocab_size=config_value(config, "embedding_size", "vocab_size"),
        hidden_size=d_model,
        intermediate_size=hidden,
        num_hidden_layers=config["n_layers"],
        num_attention_heads=n_heads,
        num_key_value_heads=config_value(config, "n_kv_heads", default=n_heads),
        hidden_act="silu",
        max_position_embeddings=config_value(config, "max_sequence_length", default=4096),
        # LLaDA uses 1e-5; Llama's default 1e-6 would shift the logits by ~3e-3.
        rms_norm_eps=config_value(config, "rms_norm_eps", default=1e-5),
        rope_parameters={"rope_type": "default", "rope_theta": float(config.get("rope_theta", 10000.0))},
        attention_bias=False,
        mlp_bias=False,
        tie_word_embeddings=tied,
        pad_token_id=config.get("pad_token_id"),
        eos_token_id=config.get("eos_token_id"),
        bos_token_id=config.get("bos_token_id"),
        use_cache=False,
    )
    llama.is_causal = False  # DLM: every token attends to every token
    return llama


_common = dict(
    is_diffusion=True,
    sampler="llada",
    model_class=LlamaForCausalLM,
    build_config=to_llama_config,
    special_tokens=partial(special_tokens_from, mask_token=MASK_TOKEN, eot_tokens=(EOT_TOKEN,)),
    key_mapping=KEY_MAPPING,
    padding="key_padding",  # official LLaDA: key-padding bias only, positions unshifted
)

# MMaDA first: its configs may also carry LLaDA's keys.
MMADA = register_family(Family(name="mmada", matches=is_mmada, **_common))
LLADA = register_family(Family(name="llada", matches=is_llada, **_common))
