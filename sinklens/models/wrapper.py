"""`SinkModel`: a loaded transformers model plus its family adapter, ids and tokenizer."""
from __future__ import annotations

from contextlib import nullcontext
from typing import Any

import torch

from sinklens.attention.readouts import finish_lens, readout_hooks

from .families import Family, token_id
from .variants import detect_variant


class SinkModel:
    """What `sinklens.load` returns (docs/design.md, Contract 1).

    model: LlamaForCausalLM / Qwen2ForCausalLM in eval mode (DLMs with config.is_causal False).
    """

    def __init__(self, model, family: Family, tokenizer, config_dict: dict, source: dict):
        self.model = model
        self.family = family
        self.tokenizer = tokenizer  # None when the checkpoint ships no tokenizer (test fixtures)
        self.config_dict = config_dict  # the checkpoint's own config.json
        self.source = source
        ids = family.special_tokens(config_dict, tokenizer)
        self.mask_id, self.eos_id, self.pad_id, self.eot_id = ids.mask_id, ids.eos_id, ids.pad_id, ids.eot_id
        self.stop_ids = ids.stop_ids
        # A published checkpoint of this family (iLLaDA, LLaDA 1.5, Dream-Coder, DiffuCoder) or None.
        self.variant = detect_variant(family.name, config_dict, tokenizer, source.get("name_or_path"), self.mask_id)
        pad = token_id(tokenizer, self.variant.pad_token) if self.variant and self.variant.pad_token else None
        if pad is not None:  # DiffuCoder fills the tail after its answer with <|dlm_pad|>
            self.pad_id, self.stop_ids = pad, tuple(dict.fromkeys((*self.stop_ids, pad)))
        source["variant"] = None if self.variant is None else self.variant.name
        config = model.config.get_text_config()  # DiffusionGemma: the text part of a composite config
        self.num_layers = config.num_hidden_layers
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = getattr(config, "num_key_value_heads", None) or self.num_heads  # encoders: no GQA
        self.max_length = config.max_position_embeddings

    @property
    def is_diffusion(self) -> bool:
        return self.family.is_diffusion

    @property
    def attention_windows(self) -> tuple[int | None, ...] | None:
        """Per layer, the sliding window the attention uses (None = full attention); None when no
        layer slides. The numbers are transformers' `sliding_window`: on a causal layer query i
        sees keys j with i − window < j ≤ i; on a bidirectional encoder |i − j| ≤ window; in
        DiffusionGemma's decoder the cache keeps the last window − 1 keys before the canvas."""
        config = self.model.config.get_text_config(decoder=True)
        window = getattr(config, "sliding_window", None)
        types = getattr(config, "layer_types", None)
        if not window or (types is None and not getattr(config, "use_sliding_window", True)):
            return None
        types = types or ["sliding_attention"] * self.num_layers
        windows = tuple(int(window) if t == "sliding_attention" else None for t in types)
        return windows if any(w is not None for w in windows) else None

    @property
    def attention_layout(self) -> dict:
        """The model's attention facts, as trace-layout fields: from them the sink rule knows
        which keys each query could see (trace/layout.py, rule/spec.py)."""
        windows = self.attention_windows
        kind = {"causal": "causal", "encoder-decoder": "cache"}.get(self.family.attention, "symmetric")
        block = self.family.ops.block_size(self) if self.family.attention == "block-causal" else None
        return {"causal": self.family.causal, "windows": windows, "window_kind": kind if windows else None,
                "attention_block": block}

    @property
    def device(self) -> torch.device:
        """Where inputs are made. A model whose every weight is offloaded to disk (device_map) has
        them on the meta device: accelerate streams them to its execution device and moves the
        inputs there itself, so inputs start on the first device that holds a layer, else the CPU."""
        device = self.model.device
        if device.type != "meta":
            return device
        placed = [d for d in (getattr(self.model, "hf_device_map", None) or {}).values() if d != "disk"]
        return torch.device(placed[0] if placed else "cpu")

    @property
    def dtype(self) -> torch.dtype:
        return self.model.dtype

    def __repr__(self) -> str:
        variant = None if self.variant is None else self.variant.name
        return (
            f"SinkModel(family={self.family.name!r}, variant={variant!r}, layers={self.num_layers}, heads={self.num_heads}, "
            f"kv_heads={self.num_kv_heads}, dtype={self.dtype}, source={self.source['name_or_path']!r})"
        )

    # -----------------------------------------------------------------------------------

    def position_ids_for(self, attention_mask: torch.Tensor | None) -> torch.Tensor | None:
        """Position ids the family's official code uses under padding (None = 0..S-1)."""
        return self.family.position_ids(attention_mask)

    @torch.no_grad()
    def forward_logits(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        attention: Any = None,
    ) -> torch.Tensor:
        """Logits (B, S, V) float32, as the official model's forward returns them.

        Dream: raw, unshifted (the shift by one is the sampler's). attention_mask (B, S):
        1 = real token, 0 = pad. attention: an `AttentionRequest` (capture / block) or None.
        """
        out = self._forward(input_ids, attention_mask, position_ids, attention)
        if getattr(out, "logits", None) is None:
            raise ValueError(f"{self.family.name!r} checkpoints have no LM head here: use m.encode(...) for hidden states")
        return out.logits.float()  # (B, S, V)

    @torch.no_grad()
    def encode(self, input_ids, attention_mask=None, attention: Any = None) -> torch.Tensor:
        """Last hidden states (B, S, D) float32 of an encoder (BERT, ModernBERT): one forward pass."""
        return self._forward(input_ids, attention_mask, None, attention).last_hidden_state.float()

    def _forward(self, input_ids, attention_mask, position_ids, attention):
        """The model's own output object; checks the inputs and hands `attention` to the attention function."""
        if self.family.attention == "encoder-decoder":
            raise ValueError(f"{self.family.name!r} runs an encoder and a decoder over a canvas: there is no single "
                             "forward of a sequence; use m.generate(...) (traced per denoising step)")
        input_ids = self._check_ids(input_ids)  # (B, S)
        if attention_mask is not None:
            attention_mask = self._check_mask(attention_mask, input_ids)
        if position_ids is None:
            position_ids = self.position_ids_for(attention_mask)
        elif position_ids.shape != input_ids.shape:
            raise ValueError(f"position_ids shape {tuple(position_ids.shape)} != input_ids shape {tuple(input_ids.shape)}")
        kwargs = {}
        if attention is not None:
            if getattr(attention, "query_mask", None) is None and attention_mask is not None:
                attention.query_mask = attention_mask.bool()  # padded queries are not summed
        if self.family.attention == "causal" or self.is_diffusion:
            kwargs["use_cache"] = False  # decoders only; encoders take no cache argument
        device = self.device
        kernel = nullcontext()
        if self.family.attention == "block-causal":  # SDAR: the block-causal mask its training used
            attention_mask = self.family.ops.forward_mask(self, input_ids.to(device), attention_mask)
            kernel = self.family.ops.official_kernel(attention_mask)  # the sdpa backend its own code lands on
        else:
            attention_mask = self.family.padding_mask(attention_mask)  # Dream: pads hidden as queries too
        with kernel:
            return self.run_model(attention, input_ids=input_ids.to(device),
                                  attention_mask=None if attention_mask is None else attention_mask.to(device),
                                  position_ids=None if position_ids is None else position_ids.to(device), **kwargs)

    @torch.no_grad()
    def run_model(self, attention: Any = None, *, layout: dict | None = None, first_row: int | None = None,
                  **inputs):
        """The one way into the model's forward, for every family: `forward_logits`, `forward_cached`
        and the family passes that build their own inputs (SDAR's cached blocks, LLaDA2's block-causal
        windows, DiffusionGemma's decoder). Hands `attention` to the attention function and, when it
        asks for them, hooks the hidden-state readouts on the decoder layers for this forward and
        runs the logit lens after it. Returns the model's own output object.

        layout: the attention facts the lens' default positions are found under, when the sampler
        chose them (LLaDA2's block length); None = `attention_layout`. first_row: the key position
        of the first computed row (Fast-dLLM's dual cache feeds a block mid-sequence); None = the
        computed rows are the last ones."""
        if attention is not None:
            inputs["sinklens"] = attention  # reaches the attention function's kwargs
            if getattr(attention, "num_layers", 0) is None:   # its captures: one buffer for all layers (layer_sums)
                attention.num_layers = self.num_layers
        with readout_hooks(self.model, attention):     # hidden-state readouts: hooks for this forward only
            out = self.model(**inputs)
        self._finish_lens(attention, layout, first_row)
        return out

    def _finish_lens(self, attention, layout: dict | None, first_row: int | None) -> None:
        """The logit lens of a forward that asked for one: through the model's final norm and LM head
        (and its final logit soft-cap, where it has one: Gemma), so the last layer reads the logits."""
        if attention is None or not getattr(attention, "lens_layers", None):
            return
        norm = getattr(self.model.get_decoder(), "norm", None)
        if norm is None:
            raise ValueError(f"{type(self.model).__name__} has no final norm at get_decoder().norm: the logit lens "
                             "is not available for it")
        lm_head = self.model.get_output_embeddings()
        cap = getattr(self.model.config.get_text_config(), "final_logit_softcapping", None)

        def head(x):                                                    # (B, P, D) -> (B, P, V) float32
            logits = lm_head(norm(x)).float()
            return logits if not cap else torch.tanh(logits / cap) * cap

        finish_lens(attention, head, self.attention_layout if layout is None else layout, first_row)

    @torch.no_grad()
    def forward_cached(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor,
                       cache, attention: Any = None, first_row: int | None = None) -> torch.Tensor:
        """One cached decoding forward of a causal model: logits (B, S_q, V) of the fed rows.

        input_ids (B, S_q) the uncached tokens; attention_mask (B, S_past + S_q); cache: a
        transformers `Cache`, updated in place. The ARM sampler's only way into the model, and
        Fast-dLLM's; first_row: the key position of the first fed row when they are not the last
        ones (the dual cache's block), for the logit lens.
        """
        out = self.run_model(attention, first_row=first_row, input_ids=input_ids, attention_mask=attention_mask,
                             position_ids=position_ids, past_key_values=cache, use_cache=True)
        return out.logits  # (B, S_q, V)

    def _check_ids(self, input_ids) -> torch.Tensor:
        if not isinstance(input_ids, torch.Tensor):
            input_ids = torch.as_tensor(input_ids)
        if input_ids.dim() == 1:
            input_ids = input_ids[None]
        if input_ids.dim() != 2 or input_ids.dtype not in (torch.long, torch.int32, torch.int64):
            raise ValueError(f"input_ids must be a (B, S) integer tensor, got {tuple(input_ids.shape)} {input_ids.dtype}")
        vocab = self.model.config.get_text_config().vocab_size
        if input_ids.numel() and (int(input_ids.min()) < 0 or int(input_ids.max()) >= vocab):
            raise ValueError(f"input_ids must lie in [0, {vocab}), got range [{int(input_ids.min())}, {int(input_ids.max())}]")
        if input_ids.shape[1] > self.max_length:
            raise ValueError(f"sequence length {input_ids.shape[1]} exceeds the model's max_length {self.max_length}")
        return input_ids.long()

    @staticmethod
    def _check_mask(attention_mask, input_ids: torch.Tensor) -> torch.Tensor:
        attention_mask = torch.as_tensor(attention_mask)
        if attention_mask.dim() == 1:
            attention_mask = attention_mask[None]
        if attention_mask.shape != input_ids.shape:
            raise ValueError(
                f"attention_mask shape {tuple(attention_mask.shape)} must equal input_ids shape {tuple(input_ids.shape)} "
                "(2-D, 1 = real token, 0 = pad)"
            )
        return attention_mask.long()

    @torch.no_grad()
    def run_with_cache(self, input_ids, attention_mask=None, *, names_filter=None) -> tuple[torch.Tensor, dict]:
        """(logits, cache) in one forward pass, TransformerLens-style (sinklens.attention.weights).

        cache["blocks.{l}.attn.hook_pattern"]: (B, H, S_q, S_k) attention probabilities;
        cache["blocks.{l}.attn.hook_received"]: (B, H, S_k) received attention (column sums).
        names_filter: None (all), a name, a list of names, or a callable name -> bool.
        """
        from sinklens.attention.weights import run_with_cache

        return run_with_cache(self, input_ids, attention_mask, names_filter)

    # -----------------------------------------------------------------------------------

    def generate(self, input_ids, attention_mask=None, *, trace=None, hook=None, capture=None, progress=False,
                 config=None, sampler=None, **sampler_kwargs):
        """Run the family's own sampler (sinklens.samplers.generate; official argument names). Arguments
        left out: the official defaults, or a sinklens-trained model's training settings, cut to the
        context with a warning (sinklens.samplers.lengths, the same policy as the command line).
        `sampler` None: the family's sampler that takes these argument names (`Family.pick_sampler`:
        LLaDA2.1's official call, with `editing_threshold`, runs LLaDA2.1's editing sampler)."""
        from sinklens.samplers import generate

        if config is None:
            sampler = self.family.pick_sampler(sampler, sampler_kwargs)
        return generate(self, input_ids, attention_mask, trace=trace, hook=hook, capture=capture, progress=progress,
                        config=config, sampler=sampler, **sampler_kwargs)

    # -----------------------------------------------------------------------------------

    def apply_chat_template(self, messages_or_prompt: str | list[dict]) -> list[int]:
        """Token ids of a chat prompt (a string becomes one user turn), ready for generation."""
        if self.tokenizer is None:
            raise ValueError(f"{self.source['path']} ships no tokenizer: pass token ids instead of text")
        if getattr(self.tokenizer, "chat_template", None) is None:
            raise ValueError(
                f"the tokenizer of {self.source['name_or_path']!r} has no chat template "
                "(a base model?): use tokenizer.encode(text) instead"
            )
        messages = messages_or_prompt
        if isinstance(messages, str):
            messages = [{"role": "user", "content": messages}]
        text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return self.tokenizer.encode(text, add_special_tokens=False)
