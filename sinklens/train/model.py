"""The twins' architecture (a small Llama) and the two folder formats they are shipped in.

DLM -> a LLaDA-format folder (official config keys and parameter names, like GSAI-ML/LLaDA-8B),
ARM -> a native Llama folder (`LlamaForCausalLM.save_pretrained`). Both therefore travel the
same loading path as real checkpoints.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers import LlamaConfig, LlamaForCausalLM

from sinklens.train.config import ModelConfig  # noqa: F401  (public here too)

ROPE_THETA = 500000.0   # LLaDA's values, so the DLM folder is a faithful (tiny) LLaDA
RMS_EPS = 1e-5


def build_model(cfg: ModelConfig, *, diffusion: bool, seed: int) -> LlamaForCausalLM:
    """A Llama with LLaDA's choices (no biases, untied head, RMSNorm 1e-5, RoPE 5e5)."""
    lc = LlamaConfig(
        vocab_size=cfg.vocab_size, hidden_size=cfg.d_model, intermediate_size=cfg.mlp_hidden,
        num_hidden_layers=cfg.n_layers, num_attention_heads=cfg.n_heads,
        num_key_value_heads=cfg.n_heads, max_position_embeddings=cfg.max_len,
        rms_norm_eps=RMS_EPS, rope_parameters={"rope_type": "default", "rope_theta": ROPE_THETA},
        tie_word_embeddings=False, attention_bias=False, mlp_bias=False, use_cache=False,
        attn_implementation="sdpa",
    )
    lc.is_causal = not diffusion   # bidirectional DLM (survives save/load)
    torch.manual_seed(seed)
    return LlamaForCausalLM(lc)


# Llama name -> LLaDA official name (ff_proj = gate, up_proj = up, block ff_out = down,
# top-level ff_out = untied LM head).
_TO_LLADA = [
    (r"^model\.embed_tokens\.weight$", "model.transformer.wte.weight"),
    (r"^model\.norm\.weight$", "model.transformer.ln_f.weight"),
    (r"^lm_head\.weight$", "model.transformer.ff_out.weight"),
    (r"^model\.layers\.(\d+)\.self_attn\.([qkv])_proj\.weight$", r"model.transformer.blocks.\1.\2_proj.weight"),
    (r"^model\.layers\.(\d+)\.self_attn\.o_proj\.weight$", r"model.transformer.blocks.\1.attn_out.weight"),
    (r"^model\.layers\.(\d+)\.mlp\.gate_proj\.weight$", r"model.transformer.blocks.\1.ff_proj.weight"),
    (r"^model\.layers\.(\d+)\.mlp\.up_proj\.weight$", r"model.transformer.blocks.\1.up_proj.weight"),
    (r"^model\.layers\.(\d+)\.mlp\.down_proj\.weight$", r"model.transformer.blocks.\1.ff_out.weight"),
    (r"^model\.layers\.(\d+)\.input_layernorm\.weight$", r"model.transformer.blocks.\1.attn_norm.weight"),
    (r"^model\.layers\.(\d+)\.post_attention_layernorm\.weight$", r"model.transformer.blocks.\1.ff_norm.weight"),
]


def llada_name(name: str) -> str:
    for pat, repl in _TO_LLADA:
        new, n = re.subn(pat, repl, name)
        if n:
            return new
    raise KeyError(f"no LLaDA name for parameter {name!r}")


def llada_config(cfg: ModelConfig, *, mask_id: int, eos_id: int, pad_id: int, dtype: str) -> dict:
    """config.json with the key set of the official LLaDA-8B config (fixtures/reference/llada)."""
    return {
        "activation_type": "silu", "alibi": False, "alibi_bias_max": 8.0,
        "architectures": ["LLaDAModelLM"], "attention_dropout": 0.0,
        "attention_layer_norm": False, "attention_layer_norm_with_affine": True,
        # Kept as in the official folder (it names remote code we never ship or run).
        "auto_map": {"AutoConfig": "configuration_llada.LLaDAConfig",
                     "AutoModelForCausalLM": "modeling_llada.LLaDAModelLM",
                     "AutoModel": "modeling_llada.LLaDAModelLM"},
        "bias_for_layer_norm": False, "block_group_size": 1, "block_type": "llama",
        "d_model": cfg.d_model, "embedding_dropout": 0.0, "embedding_size": cfg.vocab_size,
        "eos_token_id": eos_id, "flash_attention": False, "include_bias": False,
        "include_qkv_bias": False, "init_cutoff_factor": None, "init_device": "meta",
        "init_fn": "mitchell", "init_std": 0.02, "input_emb_norm": False,
        "layer_norm_type": "rms", "layer_norm_with_affine": True, "mask_token_id": mask_id,
        "max_sequence_length": cfg.max_len, "mlp_hidden_size": cfg.mlp_hidden, "mlp_ratio": 4,
        "model_type": "llada", "multi_query_attention": None, "n_heads": cfg.n_heads,
        "n_kv_heads": cfg.n_heads, "n_layers": cfg.n_layers, "pad_token_id": pad_id,
        "precision": {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32"}[dtype],
        "residual_dropout": 0.0, "rms_norm_eps": RMS_EPS, "rope": True,
        "rope_full_precision": True, "rope_theta": ROPE_THETA, "scale_logits": False,
        "transformers_version": "4.49.0", "use_cache": False, "vocab_size": cfg.vocab_size,
        "weight_tying": False,
    }


def save_llada_folder(model: LlamaForCausalLM, cfg: ModelConfig, folder: str | Path, *,
                      mask_id: int, eos_id: int, pad_id: int, dtype: torch.dtype = torch.float16) -> None:
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    state = {llada_name(k): v.detach().to(dtype).contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    conf = llada_config(cfg, mask_id=mask_id, eos_id=eos_id, pad_id=pad_id, dtype=str(dtype).split(".")[-1])
    (folder / "config.json").write_text(json.dumps(conf, indent=1, sort_keys=True) + "\n")


def save_llama_folder(model: LlamaForCausalLM, folder: str | Path, *, eos_id: int, pad_id: int,
                      dtype: torch.dtype = torch.float16) -> None:
    import copy
    m = copy.deepcopy(model).to(dtype)
    m.config.eos_token_id, m.config.pad_token_id, m.config.bos_token_id = eos_id, pad_id, None
    # the generation config was made from the config's defaults when the model was built (EOS 2, BOS 1):
    # it must name the same ids, or transformers' own generate stops at another token
    m.generation_config.eos_token_id, m.generation_config.pad_token_id = eos_id, pad_id
    m.generation_config.bos_token_id = None
    m.save_pretrained(str(folder), safe_serialization=True)


def save_dream_folder(model: LlamaForCausalLM, cfg: ModelConfig, folder: str | Path, *, mask_id: int,
                      eos_id: int, pad_id: int, dtype: torch.dtype = torch.float16) -> None:
    """A Dream-format folder (Qwen2 names and config keys, as the official Dream-v0 checkpoint):
    Llama and Qwen2 share parameter names; Qwen2's q/k/v biases are zero, so it is the same function."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().to(dtype).contiguous() for k, v in model.state_dict().items()}
    for i in range(cfg.n_layers):
        for proj in "qkv":
            w = state[f"model.layers.{i}.self_attn.{proj}_proj.weight"]
            state[f"model.layers.{i}.self_attn.{proj}_proj.bias"] = torch.zeros(w.shape[0], dtype=dtype)
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    conf = {
        "architectures": ["DreamModel"], "model_type": "Dream",
        "auto_map": {"AutoConfig": "configuration_dream.DreamConfig", "AutoModel": "modeling_dream.DreamModel"},
        "hidden_size": cfg.d_model, "intermediate_size": cfg.mlp_hidden, "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads, "num_key_value_heads": cfg.n_heads, "hidden_act": "silu",
        "max_position_embeddings": cfg.max_len, "rms_norm_eps": RMS_EPS, "rope_theta": ROPE_THETA,
        "rope_scaling": None, "use_sliding_window": False, "sliding_window": None, "tie_word_embeddings": False,
        "vocab_size": cfg.vocab_size, "mask_token_id": mask_id, "eos_token_id": eos_id, "pad_token_id": pad_id,
        "bos_token_id": None, "attention_dropout": 0.0, "use_cache": False, "torch_dtype": str(dtype).split(".")[-1],
    }
    (folder / "config.json").write_text(json.dumps(conf, indent=1, sort_keys=True) + "\n")


def param_count(cfg: ModelConfig) -> int:
    return sum(p.numel() for p in build_model(cfg, diffusion=True, seed=0).parameters())

