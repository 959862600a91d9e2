"""The per-step hook protocol: what a sampler asks its hooks before a step (`before_step`: e.g.
keys to block) and hands them after it (`after_step(StepEvent)`). The trace writer and the
masking policy are hooks; `sinklens.samplers.steps` calls them, samplers never do.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Iterable

import torch

from sinklens.attention.request import AttentionRequest
from sinklens.trace.layout import TraceLayout


@dataclass
class StepEvent:
    step: int  # global step index (LLaDA: block * steps_per_block + inner step; ARM: 0 = prefill)
    tokens: torch.Tensor  # (B, S) the canvas fed to the model at this step (ARM: the whole prefix)
    is_masked: torch.Tensor  # (B, S) bool, mask state fed to the model (ARM: all False)
    revealed: torch.Tensor  # (B, S) bool, positions committed at this step
    logits: torch.Tensor  # (B, S_q, V) as the sampler used them (Dream: shifted; ARM: the query rows)
    attention: AttentionRequest | None  # the step's request, with its captured attention
    block: tuple[int, int] | None = None  # LLaDA: (start, end) absolute positions of the current block
    # (B, S) bool: already-unmasked tokens rewritten at this step (LLaDA2.1's editing); None: the
    # sampler never rewrites a token (then "is masked" only ever goes from True to False)
    edited: torch.Tensor | None = None
    attention_mask: torch.Tensor | None = None  # (B, S) bool real (non-pad) positions
    query_positions: list[torch.Tensor] | None = None  # per row: absolute positions of the query rows
    # which keys the step's queries could see (block-causal attention, windows), as the trace
    # records it; None: the model's own facts (SinkModel.attention_layout)
    layout: TraceLayout | None = None
    # (B, S) float32: at each revealed position the probability the step's logits gave the token
    # committed there, NaN elsewhere; None: nothing committed, or no hook reads it (the paper's §5.2
    # readout; a hook that never reads it says so with `wants_commit_prob = False`)
    commit_prob: torch.Tensor | None = None
    # the fields whose tensors nothing changes after the step (made for this step alone, or a copy
    # `Steps` took): a hook may keep them without a copy of its own. Every event tensor is read-only
    # to a hook; the others are the sampler's, which it may change in place at its next step.
    fresh: tuple[str, ...] = ()


_TAKES_MASK: dict = {}  # a hook class' before_step -> whether it takes attention_mask (asked per generation)


def takes_mask(before_step) -> bool:
    """Whether a hook's `before_step` takes the `attention_mask` keyword. Remembered per function:
    `inspect.signature` costs ~150 Python calls, and an eval makes a masking policy per sample."""
    fn = getattr(before_step, "__func__", None)   # a method: its class' function (bound methods are new each time)
    if fn is None:
        return "attention_mask" in inspect.signature(before_step).parameters
    if fn not in _TAKES_MASK:
        _TAKES_MASK[fn] = "attention_mask" in inspect.signature(before_step).parameters
    return _TAKES_MASK[fn]


class Hooks:
    """Several hooks behaving as one. A hook is an object with `before_step` and/or `after_step`,
    or a plain callable (used as `after_step`)."""

    def __init__(self, hooks: Iterable[Any]):
        self.hooks = [h for h in hooks if h is not None]
        for h in self.hooks:
            if not (callable(h) or hasattr(h, "before_step") or hasattr(h, "after_step")):
                raise TypeError(f"hook {h!r} has neither before_step nor after_step and is not callable")
        # `before_step` may take an optional `attention_mask` (B, S) keyword (e.g. a probe pass
        # needs it); older three-argument hooks keep working.
        self._wants_mask = {id(h) for h in self.hooks if hasattr(h, "before_step") and takes_mask(h.before_step)}
        # `StepEvent.commit_prob` costs a dozen tensor ops a step: made unless every hook says it never
        # reads it (`wants_commit_prob = False`, as the masking policy does)
        self.want_commit_prob = any(getattr(h, "wants_commit_prob", True) for h in self.hooks)

    def __bool__(self) -> bool:
        return bool(self.hooks)

    @property
    def want_attention(self) -> bool:
        """Hooks that read `event.attention` say so with `wants_attention = True`."""
        return any(getattr(h, "wants_attention", False) for h in self.hooks)

    def before_step(self, step: int, tokens: torch.Tensor, is_masked: torch.Tensor,
                    attention_mask: torch.Tensor | None = None) -> AttentionRequest | None:
        """Merge the hooks' requests: `blocked` is OR-ed, `capture` / `keep_self` too.
        attention_mask: (B, S) bool real (non-pad) positions of `tokens`."""
        merged: AttentionRequest | None = None
        for h in self.hooks:
            fn = getattr(h, "before_step", None)
            if fn is None:
                continue
            kw = {"attention_mask": attention_mask} if id(h) in self._wants_mask else {}
            req = fn(step, tokens, is_masked, **kw)
            if req is None:
                continue
            if merged is None:
                merged = req
                continue
            merged.capture = merged.capture or req.capture
            merged.keep_self = merged.keep_self or req.keep_self
            if req.blocked is not None:
                merged.blocked = req.blocked if merged.blocked is None else merged.blocked | req.blocked
        return merged

    def after_step(self, event: StepEvent) -> None:
        for h in self.hooks:
            fn = getattr(h, "after_step", None)
            if fn is not None:
                fn(event)
            elif callable(h):
                h(event)
