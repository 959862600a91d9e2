"""SDAR (JetAstra) -> transformers' Qwen3ForCausalLM under a block-causal mask.

SDAR's remote code is Qwen3's modeling file with three changes, none of them in the weights:
the attention takes a ready-made mask (block-causal: a position sees its own block and every
earlier one, blocks of `block_size` counted from position 0), a forward may *read* a KV cache
without *storing* into it (`store_kv=False`: the denoising forwards of the active block), and
RMSNorm / unmasked attention run through flash-attn kernels (the same maths as Qwen3's
RMSNorm and plain sdpa). The parameter names are Qwen3's, so nothing is mapped.

The dual checkpoint (`tiny-dual`, sinklens/train/dual.py) is the same layout on another
architecture: one set of weights trained both as block diffusion and as an ARM. Its folder is a
native Llama folder (transformers loads it as an ARM as it is) whose config.json also holds SDAR's
`block_size` and a `mask_token_id`, and `dual_modes`, which names it dual. Here it is the SDAR family
on `LlamaForCausalLM` (family "sdar-llama": SDAR's block-causal forwards and sampler, nothing of
Qwen3's q/k norms, which the Llama-shaped twin never had) and, under `mode="ar"`, the generic
Llama ARM. Weights, names and tokenizer are the same file in both modes.

Here the mask is a 4-D bool mask handed to Qwen3 as is, and "read without storing" is a forward
into a `DynamicCache` that is cropped back afterwards. The sampler (`sinklens/samplers/sdar/`)
reaches these passes as `model.family.ops`, never by importing this module.
"""
from __future__ import annotations

import dataclasses
from contextlib import nullcontext
from functools import partial
from types import SimpleNamespace

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

from .families import Family, architectures, config_value, decoder_kwargs, register_family, special_tokens_from

DUAL_MODES = ("diffusion", "ar")  # a dual checkpoint's `dual_modes`: the first is its default
MASK_TOKEN = "<|MASK|>"  # SDAR's generate.py strips this string from the decoded text
EOT_TOKEN = "<|im_end|>"


def is_sdar(config: dict) -> bool:
    # the dense SDAR models only: SDAR's MoE variant is another architecture (not mapped here)
    if any("moe" in a for a in architectures(config)):
        return False
    return str(config.get("model_type", "")).lower() == "sdar" or any(a.startswith("sdar") for a in architectures(config))


def to_qwen3_config(config: dict) -> Qwen3Config:
    """SDAR config.json dict -> Qwen3Config. The official attention never applies a sliding
    window (its sdpa and flash calls take none), so every layer is full attention here too."""
    if config.get("rope_scaling"):
        raise ValueError(f"SDAR config rope_scaling={config['rope_scaling']!r} is not supported (expected null)")
    qwen = Qwen3Config(
        intermediate_size=config["intermediate_size"],
        head_dim=config_value(config, "head_dim", default=config["hidden_size"] // config["num_attention_heads"]),
        attention_bias=bool(config.get("attention_bias", False)),
        **decoder_kwargs(config, max_positions=32768, eps=1e-6),
    )
    qwen.is_causal = False  # every mask is given explicitly (block-causal), never Qwen3's causal one
    return qwen


def block_size(m) -> int:
    """The block size the checkpoint was trained with: config.json `block_size` (4 in every SDAR
    chat config seen; 4 where a config leaves it out)."""
    return int(m.config_dict.get("block_size") or 4)


def block_causal_mask(q_pos: torch.Tensor, k_pos: torch.Tensor, block: int,
                      key_real: torch.Tensor | None = None) -> torch.Tensor:
    """(B|1, 1, S_q, S_k) bool: query i may see key j iff j's block <= i's block (blocks of `block`
    from position 0). q_pos (S_q,), k_pos (S_k,) absolute positions; key_real (B, S_k) bool pads."""
    ok = (k_pos[None, :] // block) <= (q_pos[:, None] // block)  # (S_q, S_k)
    ok = ok[None, None]
    if key_real is not None:
        ok = ok & key_real.bool()[:, None, None, :]
    return ok


def forward_mask(m, input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
    """The mask of a full-sequence forward (`SinkModel.forward_logits`): block-causal with the
    checkpoint's block size, pads masked as keys. (B|1, 1, S, S) bool."""
    pos = torch.arange(input_ids.shape[1], device=input_ids.device)
    return block_causal_mask(pos, pos, block_size(m), attention_mask)


def new_cache(m):
    from transformers import DynamicCache

    return DynamicCache(config=m.model.config)


def official_kernel(mask: torch.Tensor):
    """The sdpa backend the official attention ends up on. It hands sdpa its block mask as
    (1, S_q, S_k), a shape the fused CPU kernel refuses (checked; CUDA not run here), so a masked
    forward runs sdpa's math backend; a mask with nothing masked goes to flash-attn instead (a
    fused kernel). In float32 the backends agree to ~1e-7, in bfloat16 they round differently
    (docs/models.md), so a masked forward takes the math backend here too."""
    return nullcontext() if bool(mask.all()) else sdpa_kernel([SDPBackend.MATH])


@torch.no_grad()
def forward_block(m, tokens: torch.Tensor, start: int, cache, *, store: bool, block: int,
                  attention=None) -> torch.Tensor:
    """One forward of `tokens` (B, S_q) at absolute positions start.., attending to the cached
    keys [0, start) and to themselves block-causally. store=False leaves the cache as it was (the
    official `store_kv=False`: read, do not store). Returns the logits (B, S_q, V) in the model's
    dtype, as the official sampler reads them."""
    device = m.device
    s_q = tokens.shape[1]
    cached = cache.get_seq_length()
    if cached != start:
        raise ValueError(f"the cache holds {cached} positions but the block starts at {start}")
    pos = torch.arange(start, start + s_q, device=device)
    mask = block_causal_mask(pos, torch.arange(start + s_q, device=device), block)
    with official_kernel(mask):  # readouts and the lens ride the same forward
        out = m.run_model(attention, input_ids=tokens.to(device), attention_mask=mask, position_ids=pos[None],
                          past_key_values=cache, use_cache=True)
    if not store:
        cache.crop(-s_q)  # drop this forward's keys and values again
    return out.logits


SDAR = register_family(
    Family(
        name="sdar",
        is_diffusion=True,
        sampler="sdar",
        model_class=Qwen3ForCausalLM,
        matches=is_sdar,
        build_config=to_qwen3_config,
        special_tokens=partial(special_tokens_from, mask_token=MASK_TOKEN, eot_tokens=(EOT_TOKEN,)),
        key_mapping=None,  # official names are Qwen3's
        padding="key_padding",  # generate() takes no padding; forward_logits masks pads as keys only
        attention="block-causal",
        tokenizer_fallback="Qwen2TokenizerFast",
        ops=SimpleNamespace(forward_mask=forward_mask, block_size=block_size, new_cache=new_cache,
                            forward_block=forward_block, official_kernel=official_kernel),
    )
)


def is_dual(config: dict) -> bool:
    """A dual checkpoint: a Llama config.json that names its modes and SDAR's block size."""
    return bool(config.get("dual_modes")) and "block_size" in config and config.get("model_type") == "llama"


def to_block_causal_llama(config: dict) -> LlamaConfig:
    """A dual config.json -> LlamaConfig run under explicit block-causal masks (never its causal one)."""
    llama = LlamaConfig.from_dict(config)
    llama.is_causal = False
    return llama


def dual_mode(mode: str, config: dict) -> Family:
    """The dual checkpoint's other mode: "ar" = the generic ARM adapter on the same config and weights."""
    from .arm import ARM

    return ARM.for_config(config)


SDAR_LLAMA = register_family(dataclasses.replace(
    SDAR, name="sdar-llama", model_class=LlamaForCausalLM, matches=is_dual, build_config=to_block_causal_llama,
    tokenizer_fallback=None,
    modes=tuple(DUAL_MODES), for_mode=dual_mode))
