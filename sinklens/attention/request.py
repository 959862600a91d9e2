"""Per-forward-call instructions for the sinklens attention function, and what it captured.

One `AttentionRequest` travels with one forward call as the keyword argument `sinklens=...`
(transformers hands unknown keyword arguments down to the attention function), so the
attention function never needs global state. The caller sets the instruction fields; the
attention function fills the output fields, one layer at a time.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class AttentionRequest:
    # --- instructions (set by the caller) -------------------------------------------------
    capture: bool = False  # record received attention r_j = sum_i A[i, j] per layer and head
    query_mask: torch.Tensor | None = None  # (B, S_q) bool: real query rows; None = all real
    query_groups: torch.Tensor | None = None  # (B, S_q) long: group id per query row, -1 = none
    num_groups: int = 0  # number of query groups (e.g. 2 for masked / unmasked)
    map_slices: tuple[tuple[int, int], ...] = ()  # (layer, head) pairs whose full maps are kept
    blocked: torch.Tensor | None = None  # (L, B, H, S_k) bool: key j blocked for head h of layer l
    keep_self: bool = False  # a blocked key still receives attention from its own query
    query_chunk: int = 256  # queries per chunk in capture mode (bounds peak memory)

    # --- outputs (filled by the attention function) ---------------------------------------
    _received: dict[int, torch.Tensor] = field(default_factory=dict, repr=False)
    _received_groups: dict[int, torch.Tensor] = field(default_factory=dict, repr=False)
    # Layers with blocked keys also get what the keys *would* have received: the softmax over the
    # allowed keys before blocking, reduced in the same pass (the masking policy ranks on it).
    _received_unblocked: dict[int, torch.Tensor] = field(default_factory=dict, repr=False)
    maps: dict[tuple[int, int], torch.Tensor] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.query_chunk < 1:
            raise ValueError(f"query_chunk must be >= 1, got {self.query_chunk}")
        if self.query_groups is not None and self.num_groups < 1:
            raise ValueError("query_groups was given but num_groups < 1; set num_groups to the number of groups")
        self.map_slices = tuple((int(l), int(h)) for l, h in self.map_slices)

    @property
    def needs_probabilities(self) -> bool:
        """True when the attention probabilities must be materialised (capture or maps)."""
        return self.capture or bool(self.map_slices) or self.query_groups is not None

    def blocked_for(self, layer: int) -> torch.Tensor | None:
        """(B, H, S_k) bool keys blocked in `layer`, or None."""
        if self.blocked is None:
            return None
        if layer >= self.blocked.shape[0]:
            raise ValueError(f"blocked has {self.blocked.shape[0]} layers but layer {layer} was run")
        return self.blocked[layer]

    @property
    def received(self) -> torch.Tensor:
        """(L, B, H, S_k) float32 received attention, in column-sum units (see docs/analysis.md)."""
        if not self._received:
            raise RuntimeError("nothing captured: set capture=True and run a forward pass with this request")
        return torch.stack([self._received[l] for l in sorted(self._received)])

    @property
    def received_unblocked(self) -> torch.Tensor:
        """(L, B, H, S_k) float32 received attention as if no key had been blocked.

        Equals `received` in layers where nothing was blocked. This is the ranking source of
        sink masking: ranking on `received` would see a blocked sink at ~0 and free it next step.
        """
        received = self.received
        if not self._received_unblocked:
            return received
        return torch.stack([self._received_unblocked.get(l, received[i]) for i, l in enumerate(sorted(self._received))])

    @property
    def received_groups(self) -> torch.Tensor | None:
        """(L, B, G, H, S_k) float32 received attention per query group, or None."""
        if not self._received_groups:
            return None
        return torch.stack([self._received_groups[l] for l in sorted(self._received_groups)])
