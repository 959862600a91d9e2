"""What a masking run actually blocked, counted as it goes (no per-step history is kept, so an
8B run of 256 steps costs a few counters, not gigabytes).

Every blocked entry is one (step, layer, row, head, key). The record says how many there were,
what share of the keys that is, how many were Eq. 3 sinks of the ranking source, sat in the
prompt, were mask tokens at the step they were blocked, and which token ids they were (the
caller turns ids into categories such as punctuation / whitespace, it has the tokenizer), and
how persistent the blocking was: the share of keys blocked at step t − 1 that are blocked
again at step t (a real sink that stays a sink stays blocked: this should be high).
"""
from __future__ import annotations

from collections import Counter
from typing import Callable

import torch


class MaskingStats:
    def __init__(self) -> None:
        self.steps_masked = 0
        self.entries = 0  # blocked (step, layer, row, head, key) entries
        self.key_slots = 0  # (step, layer, row, head, real key) slots: the denominator of `blocked share`
        self.head_slots = 0  # (step, layer, row, head) slots
        self.heads_blocking = 0  # ... of which blocked at least one key
        self.sinks = 0  # blocked entries that were Eq. 3 sinks of the ranking source
        self.prompt = 0
        self.mask_tokens = 0
        self.token_ids: Counter = Counter()  # token id -> blocked entries
        self.positions: Counter = Counter()
        self.kept = 0  # keys blocked at t − 1 and again at t
        self.prev_total = 0  # keys blocked at t − 1 (consecutive masked steps only)
        self.shortfall = 0  # random control: keys that could not be matched
        self._prev: torch.Tensor | None = None

    def add(self, blocked: torch.Tensor, sinks: torch.Tensor, tokens: torch.Tensor, is_masked: torch.Tensor,
            prompt: torch.Tensor, real: torch.Tensor, shortfall: int = 0) -> None:
        """One masked step. blocked, sinks (L, B, H, S) bool; tokens (B, S); is_masked, prompt, real (B, S) bool."""
        L, B, H, S = blocked.shape
        idx = blocked.nonzero()  # (N, 4) [layer, row, head, key]
        rows, keys = idx[:, 1], idx[:, 3]
        self.steps_masked += 1
        self.entries += len(idx)
        self.key_slots += int(real.sum()) * L * H
        self.head_slots += L * B * H
        self.heads_blocking += int(blocked.any(-1).sum())
        self.sinks += int(sinks[blocked].sum())
        self.prompt += int(prompt[rows, keys].sum())
        self.mask_tokens += int(is_masked[rows, keys].sum())
        self.token_ids.update(tokens[rows, keys].tolist())
        self.positions.update(keys.tolist())
        self.shortfall += shortfall
        if self._prev is not None:
            prev = self._prev[..., :S]  # ARM: the newest key did not exist at t − 1
            self.kept += int((prev & blocked[..., : prev.shape[-1]]).sum())
            self.prev_total += int(prev.sum())
        self._prev = blocked

    def skip(self) -> None:
        """A step without blocking breaks the run of consecutive masked steps."""
        self._prev = None

    def summary(self, categorize: Callable[[int], str] | None = None, top: int = 10) -> dict:
        """JSON-ready record. `categorize(token_id) -> category` adds the share per token category."""
        n = self.entries
        frac = (lambda x: x / n) if n else (lambda x: None)  # noqa: E731
        out = {
            "steps_masked": self.steps_masked,
            "blocked_entries": n,
            "blocked_share_of_keys": self.entries / self.key_slots if self.key_slots else None,
            "heads_blocking_share": self.heads_blocking / self.head_slots if self.head_slots else None,
            "eq3_sink_share": frac(self.sinks),
            "prompt_share": frac(self.prompt),
            "mask_token_share": frac(self.mask_tokens),
            "persistence": self.kept / self.prev_total if self.prev_total else None,
            "persistence_pairs": self.prev_total,
            "top_positions": [[p, c] for p, c in self.positions.most_common(top)],
        }
        if self.shortfall:
            out["control_shortfall"] = self.shortfall
        if categorize is not None:
            cats: Counter = Counter()
            for tid, c in self.token_ids.items():
                cats[categorize(int(tid))] += c
            out["category_share"] = {k: frac(v) for k, v in sorted(cats.items())}
        return out
