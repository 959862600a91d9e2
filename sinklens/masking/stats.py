"""What a masking run actually blocked, counted as it goes (no history beyond the last few steps is
kept — at most FOLD_STEPS steps or FOLD_BYTES, counted together —, so an 8B run of 256 steps costs a
few counters, not gigabytes).

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

import numpy as np

from sinklens.rule import np_rule

# Steps are counted in batches: a step's selection and the tokens it was blocked on are held (a
# copy of the canvas, references to the rest) until FOLD_STEPS steps or FOLD_BYTES of held arrays,
# then counted with one array operation per counter for all of them. Counting each step as it came
# cost ~20 small operations a step, a tenth of a tiny model's forward (docs/benchmarks.md).
FOLD_STEPS = 64
FOLD_BYTES = 16 * 2**20


def _pad(a: np.ndarray, S: int) -> np.ndarray:
    """`a` (..., S') zero-padded on its last axis to S (an ARM's earlier steps have fewer keys)."""
    if a.shape[-1] == S:
        return a
    out = np.zeros(a.shape[:-1] + (S,), a.dtype)
    out[..., :a.shape[-1]] = a
    return out


def _stacked(arrays: list[np.ndarray], S: int) -> np.ndarray:
    """(T, ..., S) the held steps' arrays, zero-padded on the last axis to S: one stack where every
    step has S keys (a diffusion run), a pad per shorter step otherwise (an ARM's prefix grows)."""
    first = arrays[0]
    if len({a.shape for a in arrays}) == 1 and first.shape[-1] == S:
        return np.stack(arrays)
    out = np.zeros((len(arrays),) + first.shape[:-1] + (S,), first.dtype)
    for t, a in enumerate(arrays):   # an assignment per step, no call
        out[t, ..., :a.shape[-1]] = a
    return out


def _sinks(held: list[tuple], S: int) -> np.ndarray:
    """(T, L, B, H, S) bool Eq. 3 sinks of the held steps' ranking sources: those the selections already
    computed, else one call of the rule for all the steps, zero-padded to S keys (an ARM's steps grow),
    with each step's own row sums (`np_rule.visible_total`: a sum over a padded row may round
    differently). The same sinks as each step's own `Selection.sinks`."""
    if all(sel._sinks is not None for sel, *_ in held):
        return _stacked([sel._sinks for sel, *_ in held], S)
    eps = {sel.eps for sel, *_ in held}
    if len(eps) > 1:   # (one policy has one ε)
        return _stacked([sel.sink_array for sel, *_ in held], S)
    scores = _stacked([sel.scores for sel, *_ in held], S)                     # (T, L, B, H, S)
    visible = _stacked([sel.visible for sel, *_ in held], S)                   # (T, L, B, 1, S)
    if all(sel.scores.shape[-1] == S for sel, *_ in held):   # one length (a diffusion run): no padding
        return np_rule.is_sink(scores, visible, eps.pop())
    # (scores are 0 off the visible keys, as to_scores makes them: their plain sum is the visible total)
    total = np.stack([np_rule.visible_total(sel.scores) for sel, *_ in held])   # (T, L, B, H, 1)
    return np_rule.is_sink(scores, visible, eps.pop(), total)


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
        self._held: list[tuple] = []  # steps not counted yet (add)
        self._held_bytes = 0
        self._prev: np.ndarray | None = None  # (L, B, H, S) the last counted step's blocked keys, while the run goes on
        self._chained = False  # the next held step follows a masked step

    def add(self, selection, tokens: np.ndarray, is_masked: np.ndarray, prompt: np.ndarray, real: np.ndarray) -> None:
        """One masked step: `selection` (masking/select.py: blocked keys, the ranking source's Eq. 3
        sinks) and the step's tokens (B, S), is_masked, prompt, real (B, S) bool — arrays the caller
        will not change (copies of a canvas the sampler edits)."""
        self._held.append((selection, tokens, is_masked, prompt, real, self._chained))
        self._chained = True
        self._held_bytes += selection.scores.nbytes + 4 * tokens.nbytes
        if len(self._held) >= FOLD_STEPS or self._held_bytes >= FOLD_BYTES:
            self.flush()

    def skip(self) -> None:
        """A step without blocking breaks the run of consecutive masked steps."""
        self._chained = False

    def flush(self) -> None:
        """Count the held steps, all at once (summary() does; read the counters after it)."""
        held, self._held, self._held_bytes = self._held, [], 0
        if not held:
            return
        S = max([h[1].shape[-1] for h in held])
        blocked = _stacked([sel.blocked.numpy() for sel, *_ in held], S)           # (T, L, B, H, S)
        sinks = _sinks(held, S)                                                     # (T, L, B, H, S)
        tokens, is_masked, prompt, real = [_stacked([h[i] for h in held], S) for i in (1, 2, 3, 4)]
        T, L, B, H, _ = blocked.shape
        t, _, b, _, k = np.nonzero(blocked)                                        # one per blocked entry
        self.steps_masked += T
        self.entries += len(k)
        self.key_slots += int(real.sum()) * L * H
        self.head_slots += T * L * B * H
        self.heads_blocking += int(blocked.any(-1).sum())
        self.sinks += int((sinks & blocked).sum())
        self.prompt += int(prompt[t, b, k].sum())
        self.mask_tokens += int(is_masked[t, b, k].sum())
        ids, counts = np.unique(tokens[t, b, k], return_counts=True)
        self.token_ids.update(dict(zip(ids.tolist(), counts.tolist())))
        pos, counts = np.unique(k, return_counts=True)
        self.positions.update(dict(zip(pos.tolist(), counts.tolist())))
        self.shortfall += sum([sel.shortfall for sel, *_ in held])
        # persistence: pairs of consecutive masked steps (a step's earlier keys: an ARM's prefix grows)
        prev = np.concatenate([_pad(self._prev, S)[None] if self._prev is not None else np.zeros_like(blocked[:1]),
                               blocked[:-1]])                                    # (T, L, B, H, S) step t − 1
        chained = np.array([h[5] for h in held])
        chained[0] = chained[0] and self._prev is not None
        self.kept += int((prev[chained] & blocked[chained]).sum())
        self.prev_total += int(prev[chained].sum())
        self._prev = held[-1][0].blocked.numpy()

    def summary(self, categorize: Callable[[int], str] | None = None, top: int = 10) -> dict:
        """JSON-ready record. `categorize(token_id) -> category` adds the share per token category."""
        self.flush()
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
