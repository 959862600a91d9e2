"""LLaDA-MoE (inclusionAI / GSAI) -> transformers' Qwen3MoeForCausalLM (run bidirectionally).

LLaDA-MoE's remote code (`LLaDAMoEModelLM`, OLMoE-derived) is, in the options its checkpoints
use, exactly a Qwen3-MoE decoder: RMSNorm, q/k RMS-normalised per head before RoPE, RoPE over
the whole head, SwiGLU experts chosen by a softmax router whose top-k weights are *not*
renormalised (`norm_topk_prob=False`), no shared expert, dense MLP layers where
`moe_layer_freq` is 0 (Qwen3-MoE's `mlp_only_layers`). Its parameter names are Qwen3-MoE's
(per expert `mlp.experts.{e}.{gate,up,down}_proj`), which transformers fuses into its 3-D expert
tensors while loading, so nothing is mapped. Its sampler is LLaDA's.

Options the remote code has and Qwen3-MoE cannot express raise a clear error instead of
loading into a different model: a shared expert, an expert bias (the remote code *adds* it to
the routing weights), partial RoPE, no q/k norm, clipped q/k/v. Its `moe_router_score_function`,
`routed_scaling_factor` and router groups are stored but never read by its forward.
"""
from __future__ import annotations

from functools import partial

from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

from .families import Family, architectures, decoder_kwargs, register_family, special_tokens_from

MASK_TOKEN = "<|mask|>"  # the model card passes mask_id=156895; config.json names no mask id
EOT_TOKEN = "<|role_end|>"


def is_llada_moe(config: dict) -> bool:
    """Both spellings: model_type "lladamoe" (dllm's config class) or the hub's "llada" with
    architectures ["LLaDAMoEModelLM"]."""
    mt = str(config.get("model_type", "")).lower()
    return mt in ("lladamoe", "llada_moe") or any(a.startswith("lladamoe") for a in architectures(config))


# Options of the remote code that Qwen3-MoE cannot express: (key, allowed values).
_REQUIRED = {
    "shared_expert_intermediate_size": (None, 0),
    "moe_router_enable_expert_bias": (None, False),
    "partial_rotary_factor": (None, 1, 1.0),
    "qk_layernorm": (True,),
    "clip_qkv": (None,),
    "rope_scaling": (None,),
}  # `norm_topk_prob` is not among them: the remote code hard-codes False whatever the config says


def to_qwen3_moe_config(config: dict) -> Qwen3MoeConfig:
    """LLaDA-MoE config.json dict -> Qwen3MoeConfig (bidirectional, top-k weights not renormalised)."""
    for key, allowed in _REQUIRED.items():
        if config.get(key) not in allowed:
            raise ValueError(f"LLaDA-MoE config option {key}={config.get(key)!r} is not supported "
                             f"(sinklens maps LLaDA-MoE onto Qwen3-MoE, which needs {key} in {list(allowed)})")
    layers = config["num_hidden_layers"]
    freq = config.get("moe_layer_freq") or [1] * layers
    if len(freq) != layers:
        raise ValueError(f"LLaDA-MoE config moe_layer_freq has {len(freq)} entries for {layers} layers")
    qwen = Qwen3MoeConfig(
        intermediate_size=config["dense_intermediate_size"],  # the dense layers' MLP
        moe_intermediate_size=config["expert_intermediate_size"],
        head_dim=config["hidden_size"] // config["num_attention_heads"],
        attention_bias=bool(config.get("attention_bias", False)),
        num_experts=config["num_experts"],
        num_experts_per_tok=config["num_experts_per_tok"],
        norm_topk_prob=False,
        decoder_sparse_step=1,
        mlp_only_layers=[i for i, f in enumerate(freq) if f == 0],
        **decoder_kwargs(config, max_positions=4096, eps=1e-5),
    )
    qwen.is_causal = False  # DLM: every token attends to every token
    return qwen


LLADA_MOE = register_family(
    Family(
        name="llada_moe",
        is_diffusion=True,
        sampler="llada",
        model_class=Qwen3MoeForCausalLM,
        matches=is_llada_moe,
        build_config=to_qwen3_moe_config,
        special_tokens=partial(special_tokens_from, mask_token=MASK_TOKEN, eot_tokens=(EOT_TOKEN,)),
        key_mapping=None,  # official names are Qwen3-MoE's
        padding="key_padding",  # the remote attention adds a key-padding bias; positions stay 0..S-1
    )
)
