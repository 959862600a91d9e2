"""Model families: how a checkpoint's config.json maps onto a well-kept transformers class.

A `Family` is a small adapter: it recognises a config dict, converts it into a native
transformers config (Llama / Qwen2), says how the checkpoint's parameter names map onto
that class (`key_mapping` for `from_pretrained`), where the special token ids live, and how
padding is handled. Nothing here executes code shipped with a checkpoint.
"""
from __future__ import annotations

import dataclasses
from collections.abc import MutableMapping
from dataclasses import dataclass, fields
from typing import Any, Callable

from transformers import PretrainedConfig, PreTrainedModel

from sinklens._lazy import PackageRegistry


@dataclass(frozen=True)
class SpecialTokens:
    mask_id: int | None
    eos_id: int | None
    pad_id: int | None
    eot_id: int | None  # end of turn (LLaDA <|eot_id|>, Dream <|im_end|>); None if unknown
    stop_ids: tuple[int, ...] = ()  # every id that ends a generation (eos, eot, config eos lists)


@dataclass(frozen=True)
class Family:
    name: str  # "llada" | "mmada" | "dream" | "diffusion_gemma"; generic ARMs / encoders: their model_type
    is_diffusion: bool
    sampler: str  # which sampler runs it: "llada" | "dream" | "arm"
    model_class: type[PreTrainedModel]
    matches: Callable[[dict], bool]  # config.json dict -> is it this family?
    build_config: Callable[[dict], PretrainedConfig]  # config.json dict -> native config
    special_tokens: Callable[[dict, Any], SpecialTokens]  # (config dict, tokenizer or None)
    key_mapping: dict[str, str] | None = None  # regex -> replacement, applied in dict order
    # Left padding: "key_padding" = pads only masked as keys, positions 0..S-1 unshifted
    # (LLaDA's official forward); "shift_positions" = position ids cumsum(mask) - 1 with pads
    # set to 1 (Dream's diffusion_generate, and transformers' generate for ARMs).
    padding: str = "key_padding"
    # Pads hidden as queries too: a pad's row sees no key (Dream's own forward turns a 2-D padding
    # mask m into m[:, None, :, None] & m[:, None, None, :]), so its output is what attention gives
    # a row with no key (sdpa: 0). It shows where a pad's logits are read: Dream predicts token i
    # from row i - 1, so a pad right before a [MASK] (right padding) decides that [MASK]'s token.
    mask_pad_queries: bool = False
    # Tokenizer class used when the folder's tokenizer_config names a remote-code class.
    tokenizer_fallback: str | None = None
    # Logits at position i predict token i + 1 (ARMs, and Dream, trained from an ARM): scoring a
    # reference reads row i - 1 for token i. LLaDA predicts each masked token at its own position.
    shifted_logits: bool = False
    # Who attends to whom: "bidirectional" (LLaDA, Dream, encoders), "causal" (ARMs),
    # "encoder-decoder" (DiffusionGemma: causal prefix encoder, bidirectional canvas decoder);
    # "block-causal" (SDAR: blocks from position 0; `ops.forward_mask` builds the mask of a full
    # forward, `ops.block_size` says the block). The trace's `causal` flag (what the analysis
    # reads) is derived from it.
    attention: str = "bidirectional"
    # Checkpoint parameters the loaded class does not need (regex; e.g. an encoder's MLM head):
    # dropped instead of failing the strict load. None = every parameter must be used.
    ignored_keys: str | None = None
    # The family's own forward passes for its own sampler, when `forward_logits` is not enough
    # (DiffusionGemma: encode_prefix / decoder_masks / denoise / new_cache). Samplers reach them
    # through `model.family.ops`, never by importing models/ (a higher layer).
    ops: Any = None
    # Further samplers the family's checkpoints run, beside `sampler` (its default): LLaDA2's
    # `llada21` (LLaDA2.1's editing sampler; a 2.1 checkpoint's config does not tell it from 2.0).
    # `--sampler` (generate, trace, eval) accepts these and no others (`pick_sampler`).
    other_samplers: tuple[str, ...] = ()
    # A generic adapter (any causal LM, any encoder) specialised to one checkpoint's config: its
    # name (the model_type) and transformers class. None = this family as registered.
    for_config: Callable[[dict], "Family"] | None = None
    # The modes one checkpoint runs in (`sinklens.load(..., mode=)`; the first is this family, the
    # default) and the family of each other mode: a dual checkpoint (one set of weights trained
    # both as block diffusion and as an ARM: models/sdar.py) is an ARM under mode="ar". () = one mode.
    modes: tuple[str, ...] = ()
    for_mode: Callable[[str, dict], "Family"] | None = None

    @property
    def causal(self) -> bool:
        return self.attention == "causal"

    def pick_sampler(self, name: str | None, args=()) -> str:
        """The sampler to run: `name` when this family runs it (its own or one of `other_samplers`);
        with no name, the one of them that takes the most of the argument names `args` (its own
        on a tie): LLaDA2.1's official call on an llada2_moe checkpoint (whose config does not tell
        2.1 from 2.0) passes `editing_threshold`, which only `llada21` takes. A name that does not
        take `args` while another of the family's samplers does is refused naming that one."""
        own = (self.sampler, *self.other_samplers)
        if name is not None and name not in own:
            raise ValueError(f"--sampler {name!r} does not run family {self.name!r}; its samplers: {', '.join(own)}")
        given = set(args)
        if name is None:
            return max(own, key=lambda s: len(given & sampler_arguments(s)))   # max keeps the first of a tie
        missing = given - sampler_arguments(name)
        fits = [s for s in own if s != name and missing <= sampler_arguments(s)]
        if missing and fits:
            raise ValueError(f"the {name} sampler takes no {sorted(missing)}: those are arguments of the {fits[0]} "
                             f"sampler (sampler={fits[0]!r}, --sampler {fits[0]})")
        return name

    def position_ids(self, attention_mask):
        """(B, S) position ids under left padding by the family's official rule, or None (0..S-1).

        attention_mask (B, S): 1 = real token, 0 = pad.
        """
        if attention_mask is None or self.padding == "key_padding":
            return None  # LLaDA: pads are masked as keys only, positions stay 0..S-1
        mask = attention_mask.long()
        return (mask.cumsum(-1) - 1).masked_fill(mask == 0, 1)  # pads get 1 (Dream, transformers' generate)

    def padding_mask(self, attention_mask):
        """The mask the model gets for a 2-D padding mask (B, S), 1 = real token: the same mask (transformers
        hides the pads as keys), or with `mask_pad_queries` a (B, 1, S, S) bool mask that also hides
        every key from a pad's row (transformers hands a 4-D mask to the attention as it is)."""
        if attention_mask is None or not self.mask_pad_queries or bool(attention_mask.all()):
            return attention_mask  # pads hidden as keys only, or no pad at all
        real = attention_mask.bool()
        return real[:, None, :, None] & real[:, None, None, :]  # (B, 1, S_q, S_k)


def sampler_arguments(sampler: str) -> set[str]:
    """The argument names sampler `sampler` takes: its config's fields and their old names."""
    from sinklens.samplers.registry import get_config

    cls = get_config(sampler)
    return {f.name for f in fields(cls)} | set(cls.RENAMED)


# name -> Family, in registration order (= the order `detect_family` tries them). The first read
# imports every module of this package but the infrastructure named here (and `_private` ones),
# sorted by name: each adapter module registers its families while imported. Families of
# different modules never match the same config (tests/test_families_detection.py), so the order
# between modules decides nothing; inside a module it may (MMaDA before LLaDA in llada.py).
FAMILIES: MutableMapping[str, Family] = PackageRegistry(
    __package__, skip=("families", "loader", "wrapper", "variants", "options", "control"))


def register_family(family: Family) -> Family:
    """Add a family (later registrations with the same name replace earlier ones)."""
    FAMILIES[family.name] = family
    return family


def register_generic_family(mapping: dict[str, str], **facts) -> Family:
    """Register one adapter for every architecture in `mapping` (transformers' model_type -> class
    name, e.g. its causal-LM auto mapping), specialised per checkpoint by `for_config`: named after
    the checkpoint's model_type, on the class the mapping names, its config as transformers ships it."""
    import transformers

    def for_config(config: dict) -> Family:
        model_type = config.get("model_type")
        if model_type not in mapping:
            raise ValueError(f"unknown architecture: transformers {transformers.__version__} has no {facts['name']} "
                             f"class for model_type={model_type!r}")
        return dataclasses.replace(family, name=model_type, model_class=getattr(transformers, mapping[model_type]),
                                   for_config=None)

    family = Family(build_config=native_config, key_mapping=None, for_config=for_config, **facts)
    return register_family(family)


def get_family(name: str) -> Family:
    if name not in FAMILIES:
        raise ValueError(f"unknown model family {name!r}; known: {sorted(FAMILIES)}")
    return FAMILIES[name]


def detect_family(config: dict) -> Family:
    """The family of a checkpoint from its config.json dict; ValueError if none matches."""
    for family in FAMILIES.values():
        if family.matches(config):
            return family if family.for_config is None else family.for_config(config)
    raise ValueError(
        "unknown architecture: config.json has model_type="
        f"{config.get('model_type')!r}, architectures={config.get('architectures')!r}; "
        f"sinklens supports the families {list(FAMILIES)} "
        "(LLaDA/MMaDA -> Llama, Dream -> Qwen2, DiffusionGemma; any transformers causal LM or masked-LM "
        "encoder whose attention goes through its AttentionInterface)"
    )


def native_config(config: dict) -> PretrainedConfig:
    """config.json dict -> the config class transformers ships for its model_type."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    return CONFIG_MAPPING[config["model_type"]].from_dict(config)


def config_value(config: dict, *keys: str, default: Any = None) -> Any:
    """First present, non-None value among `keys` of a config dict."""
    for key in keys:
        if config.get(key) is not None:
            return config[key]
    return default


def decoder_kwargs(config: dict, *, max_positions: int, eps: float) -> dict:
    """The keyword arguments every Qwen-style decoder config takes, read from a checkpoint whose
    config.json uses transformers' own key names (Dream, SDAR, LLaDA-MoE); `max_positions` and
    `eps` are the family's defaults where the checkpoint leaves them out. No sliding window, no
    cache by default (DLMs); the MLP sizes are the caller's (they differ per family)."""
    n_heads = config["num_attention_heads"]
    return dict(
        vocab_size=config["vocab_size"],
        hidden_size=config["hidden_size"],
        num_hidden_layers=config["num_hidden_layers"],
        num_attention_heads=n_heads,
        num_key_value_heads=config_value(config, "num_key_value_heads", default=n_heads),
        hidden_act=config.get("hidden_act", "silu"),
        max_position_embeddings=config_value(config, "max_position_embeddings", default=max_positions),
        rms_norm_eps=config_value(config, "rms_norm_eps", default=eps),
        rope_parameters={"rope_type": "default", "rope_theta": float(config.get("rope_theta", 10000.0))},
        tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
        use_sliding_window=False,
        pad_token_id=config.get("pad_token_id"),
        eos_token_id=config.get("eos_token_id"),
        bos_token_id=config.get("bos_token_id"),
        use_cache=False,
    )


def architectures(config: dict) -> list[str]:
    return [a.lower() for a in (config.get("architectures") or [])]


def token_id(tokenizer: Any, token: str) -> int | None:
    """Id of `token` in the tokenizer's vocabulary, or None (no tokenizer / not a single token)."""
    if tokenizer is None:
        return None
    vocab = tokenizer.get_vocab()
    return vocab.get(token)


def first_id(value: Any) -> int | None:
    """config eos_token_id may be an int or a list (Llama 3.1): the first one."""
    if isinstance(value, (list, tuple)):
        return int(value[0]) if value else None
    return None if value is None else int(value)


def all_ids(*values: Any) -> tuple[int, ...]:
    out: list[int] = []
    for v in values:
        for i in v if isinstance(v, (list, tuple)) else [v]:
            if i is not None and int(i) not in out:
                out.append(int(i))
    return tuple(out)


def special_tokens_from(
    config: dict, tokenizer: Any, *, mask_token: str | None, eot_tokens: tuple[str, ...] = ()
) -> SpecialTokens:
    """Special ids from the checkpoint's config, else its tokenizer (never hard-coded ids).

    mask_token None = an ARM (no mask id). eot = the first of `eot_tokens` in the vocabulary.
    """
    mask_id = None
    if mask_token is not None:
        # config first, then the family's mask token by name, then the tokenizer's declared mask
        # token (iLLaDA's new tokenizer has its mask at id 5, not LLaDA's `<|mdm_mask|>`)
        declared = getattr(tokenizer, "mask_token_id", None) if tokenizer is not None else None
        mask_id = config_value(config, "mask_token_id", default=token_id(tokenizer, mask_token))
        mask_id = declared if mask_id is None else mask_id
    eos = config_value(config, "eos_token_id", default=getattr(tokenizer, "eos_token_id", None))
    pad = config_value(config, "pad_token_id", default=getattr(tokenizer, "pad_token_id", None))
    eot_id = next((i for t in eot_tokens if (i := token_id(tokenizer, t)) is not None), None)
    eos_id = first_id(eos)
    return SpecialTokens(mask_id, eos_id, first_id(pad), eot_id, all_ids(eos, eot_id))

