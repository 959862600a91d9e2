"""The KV cache of Fast-dLLM's cached decoding (NVlabs/Fast-dLLM, `llada/generate.py`,
`dream/model/generation_utils_block.py`): keys and values stored by one full forward, then read
by later forwards of a few rows, which see their own fresh keys in place of the stored ones.

    refresh   a forward of the whole canvas into an empty cache stores every position's K/V
    prefix    `keep(start)`: only positions [0, start) stay; a step feeds the rows [start, S)
              (the block and everything after it) and attends to cache + its own rows
    dual      everything stays; a step feeds the block [start, end) and attends to the cached
              keys with the block's positions replaced by its fresh keys (Fast-dLLM's
              `replace_position`)

A step stores nothing: `read_at(start)` makes every layer's `update` return the stored keys with
the fed rows written over positions [start, start + n) (appended past the stored length), so the
keys a step sees are always the S canvas positions in order, and the captured attention of a
cached key lands at its own position. Rows that were fed are recomputed each step; the stored
ones keep the values of the refresh forward (the canvas as it was then).

The stored keys are transformers' post-RoPE keys; Fast-dLLM stores them before RoPE and rotates
every key at each forward by its position: the same numbers (tests/test_fastdllm.py).
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from sinklens.samplers.steps import check_inputs, mask_id_of
from transformers.cache_utils import Cache, DynamicLayer


class ReadOnlyLayer(DynamicLayer):
    """One layer of `StepCache`: stores on its first forward, read-only after `read_at`."""

    start: int | None = None  # first position of the fed rows; None: the refresh forward (store)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if self.start is None:
            return super().update(key_states, value_states, *args, **kwargs)
        s, n = self.start, key_states.shape[-2]  # (B, H_kv, n, D) fresh rows at positions s..s+n-1
        keys = torch.cat([self.keys[..., :s, :], key_states, self.keys[..., s + n:, :]], dim=-2)
        values = torch.cat([self.values[..., :s, :], value_states, self.values[..., s + n:, :]], dim=-2)
        return keys, values

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        if self.start is None:
            return super().get_mask_sizes(query_length)
        return max(self.get_seq_length(), self.start + query_length), 0


class StepCache(Cache):
    """Fast-dLLM's cache for one block (see the module docstring)."""

    def __init__(self):
        super().__init__(layer_class_to_replicate=ReadOnlyLayer)

    def keep(self, upto: int) -> None:
        """Prefix cache: drop the stored positions from `upto` on."""
        for layer in self.layers:
            layer.crop(upto - layer.get_seq_length())

    def read_at(self, start: int) -> None:
        """Later forwards feed the rows from `start` and store nothing."""
        if not self.layers:
            raise ValueError("the cache is empty: run the refresh forward first")
        for layer in self.layers:
            layer.start = start

    def get_seq_length(self, layer_idx: int = 0) -> int:
        # the position the fed rows start at, so transformers counts their cache positions from it
        layer = self.layers[layer_idx] if layer_idx < len(self.layers) else None
        if layer is None or layer.start is None:
            return super().get_seq_length(layer_idx)
        return layer.start


def check_fast_inputs(model, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, what: str, *,
                      one_prompt: str | None, padding_why: str, needs_bidirectional: bool) -> None:
    """Fast-dLLM's input limits, one line each: a batch of one when `one_prompt` (the reason and
    what a batch may use instead) is given; no padding (`padding_why`: why the code cannot mask
    pads); a bidirectional model where a cached forward passes no mask. `what` names the options."""
    if one_prompt is not None and input_ids.shape[0] != 1:
        raise ValueError(f"{what} takes one prompt at a time ({one_prompt}), got a batch of {input_ids.shape[0]}")
    if attention_mask is not None and not bool(attention_mask.bool().all()):
        raise ValueError(f"{what} takes no padding ({padding_why}): pass prompts of one length without pad tokens")
    layout_kind = getattr(getattr(model, "family", None), "attention", "bidirectional")
    if needs_bidirectional and layout_kind != "bidirectional":
        raise ValueError(f"{what} needs bidirectional attention (Fast-dLLM's LLaDA / Dream), this model's is {layout_kind}")


class FastStart(NamedTuple):
    """What every Fast-dLLM sampler sets up before its loop (`fast_start`)."""

    x: torch.Tensor  # (B, S) the canvas: the prompt, then gen_length mask ids, on the model's device
    input_ids: torch.Tensor  # (B, P) the checked prompt, on the model's device
    mask_id: int
    args: dict  # the sampler's settings, as the trace metadata records them
    P: int  # prompt length
    S: int  # canvas length


def fast_start(model, input_ids, attention_mask, config, gen_length: int, what: str, *, one_prompt: str | None,
               padding_why: str, needs_bidirectional: bool) -> FastStart:
    """The checks (the prompt batch, then Fast-dLLM's limits: `check_fast_inputs`) and the canvas of a
    Fast-dLLM run; the canvas lives with the model, since cached forwards take their rows as they are."""
    mask_id = mask_id_of(model, config)
    P = torch.as_tensor(input_ids).shape[-1]
    S = P + gen_length
    input_ids, attention_mask = check_inputs(input_ids, attention_mask, S, getattr(model, "max_length", None))
    check_fast_inputs(model, input_ids, attention_mask, what, one_prompt=one_prompt, padding_why=padding_why,
                      needs_bidirectional=needs_bidirectional)
    input_ids = input_ids.to(model.device)
    x = torch.nn.functional.pad(input_ids, (0, gen_length), value=mask_id)
    return FastStart(x, input_ids, mask_id, {**config.to_dict(), "mask_id": mask_id}, P, S)
