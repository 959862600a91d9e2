"""Blocks and edits: where block diffusion's blocks start, which block each step denoises, how
many sinks persist from one block to the next, and which sinks sit on tokens an editing sampler
rewrote (LLaDA2.1). Numpy over an `Analysis`; the block facts come from the trace layout only.

Two kinds of blocks, both in `TraceLayout` (sinklens/trace/layout.py):

- attention blocks (`attention_block`): block-causal attention (SDAR, LLaDA2), blocks of that
  size counted from position 0, the prompt included;
- generation blocks (`block_length` after `prompt_length`): LLaDA's semi-autoregressive blocks
  under bidirectional attention.

Attention blocks win where both are set (they decide which keys a query sees).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sinklens.trace.layout import TraceLayout


@dataclass(frozen=True)
class Blocks:
    """Position p lies in block (p − start) // size; positions before `start` are the prompt (−1)."""

    start: int
    size: int
    causal_attention: bool           # True: block-causal attention (keys of later blocks unseen)

    def of(self, positions) -> np.ndarray:
        p = np.asarray(positions, np.int64)
        return np.where(p >= self.start, (p - self.start) // self.size, -1)

    def starts(self, n: int) -> list[int]:
        """First position of every block that begins inside 1 .. n − 1 (where a boundary is drawn)."""
        return [int(p) for p in range(self.start, n, self.size) if p > 0]


def blocks(layout: TraceLayout) -> Blocks | None:
    """The run's blocks, or None for a run without blocks (one block: no boundary to draw)."""
    if layout.attention_block:
        return Blocks(0, int(layout.attention_block), True)
    if layout.block_length and layout.prompt_length is not None:
        return Blocks(int(layout.prompt_length), int(layout.block_length), False)
    return None


def step_blocks(a, b: Blocks) -> np.ndarray:
    """(T,) the block each step works on: the block of its first masked generated position, else
    (all unmasked: an editing step, or a block's last forward) the block of its last position."""
    T = a.num_steps
    out = np.zeros(T, np.int64)
    for t in range(T):
        n = int(a.seq_len[t])
        masked = np.flatnonzero(a.is_masked[t, :n])
        masked = masked[masked >= b.start] if masked.size else masked
        out[t] = b.of(masked[0] if masked.size else n - 1)
    return out


@dataclass
class BlockDynamics:
    """Sinks at the last step of each block (the block's settled state), and what carries over.

    blocks        block indices in the order the run denoised them
    first_step    (len(blocks),) first step index of each block;  last_step: its last one
    sinks         per block: the set of (layer, head, position) Eq. 3 sinks at its last step
    persist / new / gone: per consecutive pair (b, b + 1): sinks of b still sinks at the end of
                  b + 1, sinks of b + 1 that b did not have, sinks of b no longer there
    in_prompt / in_earlier / in_own: per block, its sinks on prompt positions, on earlier blocks'
                  positions and on its own positions
    """

    blocks: list[int]
    first_step: list[int]
    last_step: list[int]
    sinks: list[set]
    persist: list[int]
    new: list[int]
    gone: list[int]
    in_prompt: list[int]
    in_earlier: list[int]
    in_own: list[int]

    def to_dict(self) -> dict:
        return {"rule": "sinks = (layer, head, position) Eq. 3 sinks at the last step of each block; persist = "
                        "sinks of a block still sinks at the end of the next one",
                "blocks": self.blocks, "first_step": self.first_step, "last_step": self.last_step,
                "sinks": [len(s) for s in self.sinks], "persist": self.persist, "new": self.new, "gone": self.gone,
                "in_prompt": self.in_prompt, "in_earlier_blocks": self.in_earlier, "in_own_block": self.in_own}


def block_dynamics(a) -> BlockDynamics | None:
    """Per-block sink summary of an Analysis; None when the run has no blocks."""
    b = blocks(a.source.layout)
    if b is None:
        return None
    sb = step_blocks(a, b)
    order, first, last = [], [], []
    for t, k in enumerate(sb.tolist()):            # blocks in the order the run reached them
        if not order or order[-1] != k:
            order.append(k)
            first.append(t)
            last.append(t)
        else:
            last[-1] = t
    s, P = a.sinks, int(a.source.layout.prompt_length or 0)
    sets, in_prompt, in_earlier, in_own = [], [], [], []
    for k, t in zip(order, last):
        sel = s["step"] == t
        trip = set(zip(s["layer"][sel].tolist(), s["head"][sel].tolist(), s["pos"][sel].tolist()))
        pos = np.array([p for _, _, p in trip], np.int64)
        where, prompt = b.of(pos), pos < P          # a block-causal block may hold prompt positions too
        sets.append(trip)
        in_prompt.append(int(prompt.sum()))
        in_earlier.append(int((~prompt & (where < k)).sum()))
        in_own.append(int((~prompt & (where == k)).sum()))
    pairs = list(zip(sets[:-1], sets[1:]))
    return BlockDynamics(order, first, last, sets, [len(x & y) for x, y in pairs], [len(y - x) for x, y in pairs],
                         [len(x - y) for x, y in pairs], in_prompt, in_earlier, in_own)


@dataclass
class EditedSinks:
    """Sinks on edited tokens (an editing sampler rewrote an already-unmasked token there).

    edited_at     (T, S) bool: position j was rewritten at step t
    edited_before (T, S) bool: position j has been rewritten at step t or earlier (the token there
                  is an edited one)
    sink_heads    (T, S) int: (layer, head) pairs with an Eq. 3 sink at (t, j)
    on_edited     (T,) sinks (layer, head, position) at step t that sit on an edited token
    positions     positions ever edited;  sinks_before / sinks_after: per such position, its sink
                  occurrences at steps before its first edit / from that step on
    """

    edited_at: np.ndarray
    edited_before: np.ndarray
    sink_heads: np.ndarray
    on_edited: np.ndarray
    positions: list[int]
    sinks_before: list[int]
    sinks_after: list[int]

    def to_dict(self) -> dict:
        return {"rule": "a sink sits on an edited token when its position was rewritten at that step or earlier",
                "edits": int(self.edited_at.sum()), "edited_positions": self.positions,
                "sinks_on_edited_per_step": self.on_edited.tolist(),
                "sinks_on_edited_total": int(self.on_edited.sum()),
                "sinks_before_first_edit": self.sinks_before, "sinks_from_first_edit": self.sinks_after}


def edited_sinks(a) -> EditedSinks | None:
    """Sinks on edited tokens; None when the trace records no edits (a sampler that never rewrites)."""
    if a.edited is None:
        return None
    T, S = a.edited.shape
    edited_at = a.edited.astype(bool)
    edited_before = np.logical_or.accumulate(edited_at, axis=0)     # (T, S) rewritten at t or before
    sink_heads = np.zeros((T, S), np.int64)
    np.add.at(sink_heads, (a.sinks["step"], a.sinks["pos"]), 1)
    on_edited = (sink_heads * edited_before).sum(axis=1)
    positions = np.flatnonzero(edited_at.any(axis=0)).tolist()
    first = {j: int(np.flatnonzero(edited_at[:, j])[0]) for j in positions}
    before = [int(sink_heads[: first[j], j].sum()) for j in positions]
    after = [int(sink_heads[first[j]:, j].sum()) for j in positions]
    return EditedSinks(edited_at, edited_before, sink_heads, on_edited, positions, before, after)
