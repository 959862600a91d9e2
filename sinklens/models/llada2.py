"""LLaDA2.0 / LLaDA2.1 (`model_type: llada2_moe`, `LLaDA2MoeModelLM`) -> transformers' Glm4MoeForCausalLM.

The official remote code (inclusionAI's hub files; dllm re-hosts them) is a GLM-4-MoE decoder
under other names, run without a causal mask:

- attention: one fused `query_key_value` projection whose rows are [q (H·D) | k (H_kv·D) | v (H_kv·D)],
  per-head RMSNorm on q and k (`query_layernorm` / `key_layernorm`) *before* RoPE, RoPE on the first
  `partial_rotary_factor`·D dims with the half-split rotation, output projection `dense`;
- MoE from layer `first_k_dense_replace` on: sigmoid router in float32, an expert bias used only to
  choose experts (group-limited top-k: `n_group` groups scored by their top-2, the best `topk_group`
  kept, -inf elsewhere), weights = the chosen sigmoid scores renormalised (when top-k > 1) times
  `routed_scaling_factor`, plus `num_shared_experts` shared experts; dense SwiGLU MLP before that;
- RMSNorms in float32, untied LM head, logits in float32.

Glm4Moe computes each of these the same way (its router: the same -inf group mask and
renormalisation), so only names change: the fused q/k/v rows are split by size (transformers'
`Split`, registered for this adapter's class only), the per-expert weights are fused as
transformers 5 stores them (its own glm4_moe conversion), and `key_mapping` renames the rest.
One computation differs in bfloat16: the official code mixes the chosen experts' outputs in
float32 and rounds once, Glm4Moe rounds each weighted output; `official_experts` (registered in
transformers' ExpertsInterface) mixes as the official code; and the expert bias is rounded to the
model's dtype as the official buffer is (Glm4Moe keeps it float32), which decides a tie between
two experts closer than that rounding.
Checked against the official code on a tiny random checkpoint, float32 and bfloat16: tests/test_llada2.py.
"""
from __future__ import annotations


import torch
from torch import nn
from transformers import Glm4MoeConfig, Glm4MoeForCausalLM
from transformers.conversion_mapping import get_checkpoint_conversion_mapping, register_checkpoint_conversion_mapping
from transformers.core_model_loading import Split, WeightConverter
from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

from .families import Family, architectures, config_value, register_family, special_tokens_from

# Official parameter name -> Glm4MoeForCausalLM name (regex, applied in order). The experts
# (`mlp.experts.N.{gate,up,down}_proj`), shared experts, dense MLP and the router weight already
# carry Glm4Moe's names.
KEY_MAPPING = {
    r"^model\.word_embeddings\.": "model.embed_tokens.",
    r"\.attention\.query_key_value\.": ".self_attn.qkv_proj.",
    r"\.attention\.dense\.": ".self_attn.o_proj.",
    r"\.attention\.query_layernorm\.": ".self_attn.q_norm.",
    r"\.attention\.key_layernorm\.": ".self_attn.k_norm.",
    r"\.mlp\.gate\.expert_bias$": ".mlp.gate.e_score_correction_bias",
}

# The official generate()'s defaults (its own signature), used only when neither the config nor the
# tokenizer names the token.
OFFICIAL_MASK_ID, OFFICIAL_EOS_ID = 156895, 156892
MASK_TOKEN = "<|mask|>"


class LLaDA2MoeForCausalLM(Glm4MoeForCausalLM):
    """Glm4MoeForCausalLM under its own class name, so that the fused-q/k/v split below applies to
    LLaDA2 checkpoints and to no GLM checkpoint (transformers looks conversions up by class name).

    The expert bias loads in the model's dtype, as the official buffer does (`from_pretrained`
    rounds it with everything else); Glm4Moe keeps it float32. The router adds it to float32
    scores either way, so only the bias's rounding differs, and that alone chose another expert
    in 2 of 300 random bfloat16 generations (tests/fixtures/official_sweep2)."""

    def __init__(self, config):
        super().__init__(config)
        for layer in self.model.layers:
            gate = getattr(layer.mlp, "gate", None)
            if gate is not None and hasattr(gate, "e_score_correction_bias"):
                # the default dtype here is the one from_pretrained loads in; the loader then casts to it
                gate.e_score_correction_bias = nn.Buffer(torch.zeros_like(gate.e_score_correction_bias,
                                                                          dtype=torch.get_default_dtype()))
        self._keep_in_fp32_modules_strict = set()  # post_init gathered Glm4Moe's {"e_score_correction_bias"}


EXPERTS = "llada2_official"


def official_experts(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                     top_k_weights: torch.Tensor) -> torch.Tensor:
    """Glm4Moe's experts with the official mixing: each token's expert outputs times their float32
    weights, summed over its top-k in float32, then cast once to the model's dtype (the official
    `moe_infer`). Glm4Moe casts every weighted output before adding, which rounds differently in
    bfloat16; in float32 the two agree. hidden_states (T, D), top_k_index / top_k_weights (T, k)."""
    picked = torch.zeros(*top_k_index.shape, hidden_states.shape[-1], dtype=torch.float32,
                         device=hidden_states.device)  # (T, k, D)
    for e in top_k_index.unique().tolist():
        token, slot = torch.where(top_k_index == e)
        gate, up = nn.functional.linear(hidden_states[token], self.gate_up_proj[e]).chunk(2, dim=-1)
        out = nn.functional.linear(self.act_fn(gate) * up, self.down_proj[e])  # (n, D) model dtype
        picked[token, slot] = out.float() * top_k_weights[token, slot, None].float()
    return picked.sum(dim=1).to(hidden_states.dtype)


ALL_EXPERTS_FUNCTIONS.register(EXPERTS, official_experts)


# [q | k | v] rows -> the three projections, each as large as Glm4Moe's parameter (GQA: k, v smaller).
_QKV = WeightConverter(source_patterns="self_attn.qkv_proj.weight",
                       target_patterns=["self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"],
                       operations=[Split(dim=0)])
_QKV_BIAS = WeightConverter(source_patterns="self_attn.qkv_proj.bias",
                            target_patterns=["self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias"],
                            operations=[Split(dim=0)])
if get_checkpoint_conversion_mapping(LLaDA2MoeForCausalLM.__name__) is None:  # once per process
    register_checkpoint_conversion_mapping(LLaDA2MoeForCausalLM.__name__, [_QKV, _QKV_BIAS])

# Options of the official config a Glm4Moe decoder cannot express: (key, values it needs).
_REQUIRED = {
    "use_bias": (False, None),            # a bias on the output projection (Glm4Moe has none)
    "norm_head": (False, None),
    "rope_scaling": (None,),
    "use_sliding_window": (False, None),
    "score_function": ("sigmoid", None),
    "hidden_act": ("silu", None),
}


def is_llada2(config: dict) -> bool:
    return (str(config.get("model_type", "")).lower() in ("llada2_moe", "llada2_moe_veomni")
            or "llada2moemodellm" in architectures(config))


def to_glm4_moe_config(config: dict) -> Glm4MoeConfig:
    """LLaDA2 config.json dict -> Glm4MoeConfig (bidirectional; the sampler adds the block mask)."""
    for key, allowed in _REQUIRED.items():
        if key in config and config[key] not in allowed:
            raise ValueError(f"LLaDA2 config option {key}={config[key]!r} is not supported (sinklens maps LLaDA2 "
                             f"onto Glm4MoeForCausalLM, which needs {key} in {list(allowed)})")
    if not config.get("num_experts") or not config.get("num_shared_experts"):
        raise ValueError("LLaDA2 config without routed or shared experts (num_experts="
                         f"{config.get('num_experts')!r}, num_shared_experts={config.get('num_shared_experts')!r}) "
                         "is not supported (Glm4MoeForCausalLM has both)")
    n_heads = config["num_attention_heads"]
    head_dim = config_value(config, "head_dim", default=config["hidden_size"] // n_heads)
    top_k = config["num_experts_per_tok"]
    glm = Glm4MoeConfig(
        vocab_size=config["vocab_size"],
        hidden_size=config["hidden_size"],
        intermediate_size=config["intermediate_size"],
        num_hidden_layers=config["num_hidden_layers"],
        num_attention_heads=n_heads,
        num_key_value_heads=config_value(config, "num_key_value_heads", default=n_heads),
        head_dim=head_dim,
        hidden_act="silu",
        max_position_embeddings=config_value(config, "max_position_embeddings", default=16384),
        rms_norm_eps=config_value(config, "rms_norm_eps", default=1e-5),
        rope_parameters={"rope_type": "default", "rope_theta": float(config_value(config, "rope_theta", default=1e4)),
                         "partial_rotary_factor": float(config_value(config, "partial_rotary_factor", default=0.5))},
        attention_bias=bool(config.get("use_qkv_bias", False)),
        attention_dropout=0.0,
        moe_intermediate_size=config["moe_intermediate_size"],
        num_experts_per_tok=top_k,
        n_routed_experts=config["num_experts"],
        n_shared_experts=config["num_shared_experts"],
        routed_scaling_factor=float(config_value(config, "routed_scaling_factor", default=2.5)),
        n_group=config_value(config, "n_group", default=8),
        topk_group=config_value(config, "topk_group", default=4),
        first_k_dense_replace=config_value(config, "first_k_dense_replace", default=0),
        # the official router renormalises whenever top-k > 1, whatever norm_topk_prob says
        norm_topk_prob=top_k > 1,
        use_qk_norm=bool(config.get("use_qk_norm", True)),  # the official config class defaults to True
        tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
        pad_token_id=config.get("pad_token_id"),
        eos_token_id=config.get("eos_token_id"),
        bos_token_id=config.get("bos_token_id"),
        use_cache=False,
    )
    glm.is_causal = False  # the official forward masks nothing unless given a mask (generate(): block-causal)
    glm._experts_implementation = EXPERTS
    return glm


def llada2_special_tokens(config: dict, tokenizer):
    """Config, then tokenizer; the official generate()'s defaults (mask 156895, EOS 156892) where
    neither names them and the vocabulary holds them."""
    t = special_tokens_from(config, tokenizer, mask_token=MASK_TOKEN)
    vocab = int(config.get("vocab_size") or 0)
    mask = t.mask_id if t.mask_id is not None else (OFFICIAL_MASK_ID if vocab > OFFICIAL_MASK_ID else None)
    has_eos = config.get("eos_token_id") is not None or getattr(tokenizer, "eos_token_id", None) is not None
    eos = t.eos_id if has_eos else (OFFICIAL_EOS_ID if vocab > OFFICIAL_EOS_ID else t.eos_id)
    stops = t.stop_ids if has_eos or eos is None else (eos,)
    return type(t)(mask, eos, t.pad_id, t.eot_id, stops)


class BlockCausalOps:
    """LLaDA2's forward for its samplers (reached as `model.family.ops`)."""

    @staticmethod
    @torch.no_grad()
    def window_logits(m, window: torch.Tensor, block_length: int, attention=None) -> torch.Tensor:
        """Logits (B, S, V) float32 of the window (B, S) = positions 0..S-1 under the block-causal mask of
        the official generate(): query i sees key j iff j // block_length <= i // block_length (blocks from
        position 0, so the prompt's last partial block shares its block with the first generated tokens)."""
        S = window.shape[1]
        block = torch.arange(S, device=m.device) // block_length
        allowed = (block[:, None] >= block[None, :])[None, None]  # (1, 1, S, S) bool, True = may attend
        # the lens' default positions are the sinks under these blocks, not the bidirectional forward's
        layout = {**m.attention_layout, "attention_block": block_length}
        out = m.run_model(attention, layout=layout, input_ids=window.to(m.device), attention_mask=allowed,
                          position_ids=torch.arange(S, device=m.device)[None], use_cache=False)
        return out.logits.float()


LLADA2 = register_family(
    Family(
        name="llada2",
        is_diffusion=True,
        sampler="llada2",
        model_class=LLaDA2MoeForCausalLM,
        matches=is_llada2,
        build_config=to_glm4_moe_config,
        special_tokens=llada2_special_tokens,
        key_mapping=KEY_MAPPING,
        padding="key_padding",  # batch 1 in the official generate(); positions 0..S-1
        # the forward itself is bidirectional (`forward_logits`, as the official forward without a mask);
        # block-causality belongs to the samplers, whose block_length is an argument: they run
        # `ops.window_logits` and state `attention_block` in the trace layout
        attention="bidirectional",
        ops=BlockCausalOps(),
        other_samplers=("llada21",),  # LLaDA2.1 checkpoints: the same architecture and config keys
    )
)

