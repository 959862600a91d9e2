"""Per-forward-call instructions for the sinklens attention function, and what it captured.

One `AttentionRequest` travels with one forward call as the keyword argument `sinklens=...`
(transformers hands unknown keyword arguments down to the attention function), so the
attention function never needs global state. The caller sets the instruction fields; the
attention function fills the output fields, one layer at a time.
"""
from __future__ import annotations

from dataclasses import dataclass, field, make_dataclass
from typing import NamedTuple

import numpy as np
import torch

from sinklens.attention.masks import blocked_row_bias
from sinklens.columns import READOUT_NAMES, READOUTS

ROUTES = ("auto", "compiled", "exact", "lse", "triton")  # sinklens/attention/routes/

# The mechanism readouts' instructions (sinklens/attention/readouts.py computes them): one field per
# readout declared in sinklens/columns.py, off by default (False, or None for a list of indices).
ReadoutInstructions = make_dataclass(
    "ReadoutInstructions", [(r.name, bool if r.kind == "bool" else tuple | None, field(default=r.off)) for r in READOUTS],
    slots=True)


# slots: a request is made every step and has ~30 fields; without an instance dict its construction
# stores each field in place (a dict grown field by field was most of what a tiny model's step paid for it)
@dataclass(slots=True)
class AttentionRequest(ReadoutInstructions):
    # --- instructions (set by the caller) -------------------------------------------------
    capture: bool = False  # record received attention r_j = sum_i A[i, j] per layer and head
    query_mask: torch.Tensor | None = None  # (B, S_q) bool: real query rows; None = all real
    query_groups: torch.Tensor | None = None  # (B, S_q) long: group id per query row, -1 = none
    num_groups: int = 0  # number of query groups (e.g. 2 for masked / unmasked)
    # every summed query row is in a group (set where the groups were built so: the sampler's masked /
    # unmasked split): received is then the groups' sum, which a trace leaves out without comparing them
    groups_cover_rows: bool = False
    map_slices: tuple[tuple[int, int], ...] = ()  # (layer, head) pairs whose full maps are kept
    blocked: torch.Tensor | None = None  # (L, B, H, S_k) bool: key j blocked for head h of layer l
    keep_self: bool = False  # a blocked key still receives attention from its own query
    query_chunk: int | None = None  # queries per chunk in capture mode; None = from an 8 MB cache budget
    route: str = "auto"  # capture route: "compiled", "exact", "lse", "triton" or "auto" (see sinklens/attention/function.py)
    # Absolute key count when a layer may see only the *last* S_k of them (DiffusionGemma's
    # sliding-window cache): that layer's captures are right-aligned into num_keys positions
    # (earlier keys received nothing) and its `blocked` row is read for its last S_k keys.
    # None = every layer sees all keys.
    num_keys: int | None = None
    # The model's layer count (the model wrapper sets it): a forward's captures are then views of one
    # (L, ...) buffer each (`layer_sums`), read as a whole with no stack. None: per-layer buffers.
    num_layers: int | None = None
    # Mechanism readouts: the fields of ReadoutInstructions above (value_norms, ..., lens_positions)

    # --- outputs (filled by the attention function) ---------------------------------------
    _received: dict[int, torch.Tensor] = field(default_factory=dict, repr=False)
    _received_groups: dict[int, torch.Tensor] = field(default_factory=dict, repr=False)
    # Layers with blocked keys also get what the keys *would* have received: the softmax over the
    # allowed keys before blocking, reduced in the same pass (the masking policy ranks on it).
    _received_unblocked: dict[int, torch.Tensor] = field(default_factory=dict, repr=False)
    maps: dict[tuple[int, int], torch.Tensor] = field(default_factory=dict, repr=False)
    # Models with learned sink logits (gpt-oss): the share of the softmax each head's sink took.
    _learned_sink: dict[int, torch.Tensor] = field(default_factory=dict, repr=False)
    # readouts: column name -> layer -> (B, ...) tensor; the logit lens: positions / tokens / probs
    _readouts: dict[str, dict[int, torch.Tensor]] = field(default_factory=dict, repr=False)
    _lens_hidden: dict[int, torch.Tensor] = field(default_factory=dict, repr=False)
    lens: dict[str, torch.Tensor] | None = field(default=None, repr=False)
    # the query rows' weights, made once per forward for all layers (attention/reduce.py: row_weights)
    _row_weights: tuple | None = field(default=None, repr=False)
    _row_matrix: tuple | None = field(default=None, repr=False)  # (masks key, masks, (rows,)): reduce.row_matrix
    # work buffers the layers of one forward reuse instead of each allocating its own (readouts)
    _scratch: dict = field(default_factory=dict, repr=False)
    _blocked_cache: tuple | None = field(default=None, repr=False)  # (blocked, its version, _blocked_facts())
    _kept_cache: tuple | None = field(default=None, repr=False)  # (blocked, its version, per layer 1 − blocked)
    _sums: dict = field(default_factory=dict, repr=False)  # capture name -> _Sums: layer_sums

    def __post_init__(self) -> None:
        if self.query_chunk is not None and self.query_chunk < 1:
            raise ValueError(f"query_chunk must be >= 1 or None (automatic), got {self.query_chunk}")
        if self.route not in ROUTES:
            raise ValueError(f"route must be one of {', '.join(ROUTES)}, got {self.route!r}")
        if self.query_groups is not None and self.num_groups < 1:
            raise ValueError("query_groups was given but num_groups < 1; set num_groups to the number of groups")
        # (a request is made every step, and most keep no maps: no generator for those)
        self.map_slices = tuple((int(l), int(h)) for l, h in self.map_slices) if self.map_slices else ()

    @property
    def needs_probabilities(self) -> bool:
        """True when the attention probabilities must be materialised (capture or maps)."""
        return (self.capture or bool(self.map_slices) or self.query_groups is not None or self.diagonal
                or self.distance)

    READOUT_FIELDS = READOUT_NAMES

    def blocked_for(self, layer: int, shape: tuple[int, int, int] | None = None) -> torch.Tensor | None:
        """(B, H, S_k) bool keys blocked in `layer`, or None (also where it blocks no key). `shape`: the
        layer's (B, H, S_k), checked (with `num_keys`, the last S_k of the row are the layer's keys)."""
        if self.blocked is None:
            return None
        if layer >= self.blocked.shape[0]:
            raise ValueError(f"blocked has {self.blocked.shape[0]} layers but layer {layer} was run")
        any_key, rows, _ = self._blocked_facts()
        blocked = rows[layer]
        if shape is not None:
            if self.num_keys is not None:
                blocked = blocked[..., blocked.shape[-1] - shape[-1]:]  # this layer's keys are the last S_k
            if tuple(blocked.shape) != tuple(shape):
                raise ValueError(f"blocked for layer {layer} has shape {tuple(blocked.shape)}, expected (B, H, S_k) = "
                                 f"{tuple(shape)}")
        return blocked if any_key[layer] else None

    def row_bias_for(self, layer: int, dtype: torch.dtype, s_k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """masks.blocked_row_bias of `blocked_for(layer)` (B, H, S_k): (bias (B, H, 1, S_k), first_free (B, H) int32),
        made for every layer at a forward's first asking (on a GPU each op is a kernel launch per layer)."""
        cached = self._scratch.get("row_bias")
        if cached is None or cached[0] is not self.blocked or cached[1] != self.blocked._version or cached[2] != dtype:
            bias, first = blocked_row_bias(self.blocked, dtype)  # (L, B, H, 1, S), (L, B, H)
            cached = self._scratch["row_bias"] = (self.blocked, self.blocked._version, dtype, bias.unbind(0),
                                                  first.unbind(0))
        bias, first = cached[3][layer], cached[4][layer]
        if bias.shape[-1] != s_k:  # a layer that sees the last keys only (num_keys): its own first free key
            return blocked_row_bias(self._blocked_facts()[1][layer][..., -s_k:], dtype)
        return bias, first

    def kept_for(self, layer: int, num_keys: int) -> torch.Tensor:
        """(B, H, 1, num_keys) float32: 0.0 at the keys `blocked_for(layer)` blocks, 1.0 elsewhere, with a
        query axis to broadcast over; the last num_keys keys (as `blocked_for`'s reader cuts them)."""
        cached = self._kept_cache   # only the whole-layer pass reads it: made on its first call of a forward
        if cached is None or cached[0] is not self.blocked or cached[1] != self.blocked._version:
            kept = (torch.from_numpy((~self.blocked.numpy()).astype(np.float32)) if self.blocked.is_cpu
                    else (~self.blocked).float())
            cached = self._kept_cache = (self.blocked, self.blocked._version, kept.unsqueeze(-2).unbind(0))
        kept = cached[2][layer]  # (B, H, 1, S)
        return kept if kept.shape[-1] == num_keys else kept[..., kept.shape[-1] - num_keys:]

    def most_blocked(self, layer: int) -> int:
        """The most keys `layer` blocks for one (row, head) (0 where it blocks none): a row that sees more
        keys than this keeps one whatever is blocked."""
        facts = self._blocked_facts()
        if facts[2] is None:   # counted on first asking (only the whole-layer exact route asks)
            counts = self.blocked.numpy().sum(-1) if self.blocked.is_cpu else self.blocked.sum(-1)
            facts[2] = counts.reshape(counts.shape[0], -1).max(1).tolist()   # (L,): per layer, over rows and heads
        return facts[2][layer]

    def _blocked_facts(self) -> list:
        """Per layer: [blocks some key, its (B, H, S) blocked keys, the most keys blocked for one row and
        head (None until `most_blocked` counts them)], made once per forward for every layer (a tiny
        model's layer is a few dozen µs: each indexing op counts) and remade if `blocked` is replaced or
        edited in place."""
        cached = self._blocked_cache
        if cached is None or cached[0] is not self.blocked or cached[1] != self.blocked._version:
            # one torch reduction on any device (in place, a numpy view and its reduction cost a tiny twin's
            # first masked layer ~20 µs more)
            any_key = self.blocked.reshape(self.blocked.shape[0], -1).any(1).tolist()
            facts = [any_key, self.blocked.unbind(0), None]
            cached = self._blocked_cache = (self.blocked, self.blocked._version, facts)
        return cached[2]

    # --- filled by the attention function, one layer at a time ----------------------------
    def layer_sums(self, name: str, layer: int, shape: tuple[int, ...], device) -> torch.Tensor:
        """A zeroed float32 `shape` buffer for layer `layer`'s capture `name` ("received", "unblocked",
        "groups"): a view of one (L, *shape) buffer for all the forward's layers, so that the capture reads
        as that one tensor (on a tiny model a stack of L layers and L allocations each cost a step more
        than their arithmetic). Its own zeros for a layer the buffer does not fit (another shape or
        device: a sliding layer that keeps fewer keys, a model spread over devices), and everywhere
        while `num_layers` is unknown. A layer asking again (a second forward with this request) starts
        a new buffer: one read already is never changed."""
        L = self.num_layers
        sums = self._sums.get(name)
        if L is None or layer >= L or (sums is not None and (sums.shape != shape or sums.device != device)):
            return torch.zeros(shape, dtype=torch.float32, device=device)
        if sums is None or layer in sums.given:
            whole = torch.zeros((L,) + shape, dtype=torch.float32, device=device)
            sums = self._sums[name] = _Sums(whole, whole.unbind(0), shape, device, set())
        sums.given.add(layer)
        return sums.views[layer]

    def all_layer_sums(self, name: str, shape: tuple[int, ...], device) -> tuple[torch.Tensor, ...]:
        """`layer_sums` for every layer at once (a route that plans a forward's buffers at its first layer):
        the `num_layers` views of a new zeroed (L, *shape) buffer, every layer counted as handed one (a
        layer that asks `layer_sums` for this capture again starts a new buffer)."""
        whole = torch.zeros((self.num_layers,) + tuple(shape), dtype=torch.float32, device=device)
        views = whole.unbind(0)
        self._sums[name] = _Sums(whole, views, tuple(shape), device, set(range(self.num_layers)))
        return views

    def _whole(self, name: str, per_layer: dict[int, torch.Tensor]) -> torch.Tensor | None:
        """The (L, ...) buffer of `layer_sums(name, ...)` where `per_layer` is its every layer's view, else None."""
        sums = self._sums.get(name)
        if sums is None or len(per_layer) != len(sums.views):
            return None
        views = sums.views
        for layer, t in per_layer.items():
            if layer >= len(views) or t is not views[layer]:
                return None
        return sums.whole

    def record(self, layer: int, received=None, unblocked=None, groups=None, maps=None, learned_sink=None) -> None:
        """Store one layer's captures: received / unblocked (B, H, S_k), groups (B, G, H, S_k),
        maps {head: (B, S_q, S_k)}, learned_sink (B, H); None = not captured."""
        if self.num_keys is not None:  # a layer that saw only the last keys: put them at their positions
            align = lambda t: t if t is None else torch.nn.functional.pad(t, (self.num_keys - t.shape[-1], 0))  # noqa: E731
            received, unblocked, groups = align(received), align(unblocked), align(groups)
            maps = {head: align(m) for head, m in (maps or {}).items()}
        if received is not None:
            self._received[layer] = received
        if unblocked is not None:
            self._received_unblocked[layer] = unblocked
        if groups is not None:
            self._received_groups[layer] = groups
        for head, m in (maps or {}).items():
            self.maps[(layer, head)] = m
        if learned_sink is not None:
            self._learned_sink[layer] = learned_sink

    def record_readout(self, name: str, layer: int, value: torch.Tensor, aligned: bool = True) -> None:
        """One layer's readout `name` (B, ...); `aligned`: its last axis is the key positions (a layer
        that saw only the last keys gets them right-aligned into num_keys, as `record`)."""
        if aligned and self.num_keys is not None:
            value = torch.nn.functional.pad(value, (self.num_keys - value.shape[-1], 0))
        self._readouts.setdefault(name, {})[layer] = value

    def readout(self, name: str) -> torch.Tensor | None:
        """(L, B, ...) readout `name` stacked over layers, or None when not recorded."""
        per_layer = self._readouts.get(name)
        if not per_layer:
            return None
        return torch.stack([per_layer[l] for l in sorted(per_layer)])

    @property
    def readout_names(self) -> list[str]:
        return sorted(self._readouts)

    # --- read by samplers, traces and masking policies -----------------------------------
    @property
    def has_received(self) -> bool:
        """True once a forward pass has recorded received attention."""
        return bool(self._received)

    @property
    def has_received_unblocked(self) -> bool:
        """True once a forward pass with blocked keys has recorded their unblocked attention."""
        return bool(self._received_unblocked)

    def first_rows(self, rows: int) -> AttentionRequest:
        """A copy restricted to the first `rows` batch rows, instructions and captures alike
        (CFG runs a doubled batch and records only its conditional half)."""
        out = AttentionRequest(capture=self.capture, num_groups=self.num_groups, map_slices=self.map_slices,
                               groups_cover_rows=self.groups_cover_rows,
                               keep_self=self.keep_self, query_chunk=self.query_chunk, route=self.route,
                               **{f: getattr(self, f) for f in self.READOUT_FIELDS})
        out.query_mask = None if self.query_mask is None else self.query_mask[:rows]
        out.query_groups = None if self.query_groups is None else self.query_groups[:rows]
        out.blocked = None if self.blocked is None else self.blocked[:, :rows]
        out._received = {l: r[:rows] for l, r in self._received.items()}
        out._received_groups = {l: r[:rows] for l, r in self._received_groups.items()}
        out._received_unblocked = {l: r[:rows] for l, r in self._received_unblocked.items()}
        out.maps = {k: m[:rows] for k, m in self.maps.items()}
        out._learned_sink = {l: r[:rows] for l, r in self._learned_sink.items()}
        out._readouts = {n: {l: r[:rows] for l, r in per.items()} for n, per in self._readouts.items()}
        out.lens = None if self.lens is None else {k: v[:rows] for k, v in self.lens.items()}
        return out

    @property
    def received(self) -> torch.Tensor:
        """(L, B, H, S_k) float32 received attention, in column-sum units (see docs/analysis.md)."""
        if not self._received:
            raise RuntimeError("nothing captured: set capture=True and run a forward pass with this request")
        whole = self._whole("received", self._received)
        return gather([self._received[l] for l in sorted(self._received)]) if whole is None else whole

    @property
    def received_unblocked(self) -> torch.Tensor:
        """(L, B, H, S_k) float32 received attention as if no key had been blocked.

        Equals `received` in layers where nothing was blocked. This is the ranking source of
        sink masking: ranking on `received` would see a blocked sink at ~0 and free it next step.
        """
        if not self._received_unblocked:
            return self.received
        if len(self._received_unblocked) == len(self._received):   # every layer blocked some key
            whole = self._whole("unblocked", self._received_unblocked)
            if whole is not None:
                return whole
        return gather([self._received_unblocked.get(l, self._received[l]) for l in sorted(self._received)])

    @property
    def received_groups(self) -> torch.Tensor | None:
        """(L, B, G, H, S_k) float32 received attention per query group, or None."""
        if not self._received_groups:
            return None
        whole = self._whole("groups", self._received_groups)
        return gather([self._received_groups[l] for l in sorted(self._received_groups)]) if whole is None else whole

    @property
    def learned_sink(self) -> torch.Tensor | None:
        """(L, B, H) float32 attention taken by the model's learned sink logits (gpt-oss: a per-head
        logit that joins the softmax as a key with no value), summed over the same query rows as
        `received`, so received.sum(-1) + learned_sink = the number of those rows. None for models
        without learned sinks."""
        if not self._learned_sink:
            return None
        return gather([self._learned_sink[l] for l in sorted(self._learned_sink)])


class _Sums(NamedTuple):
    """One capture's buffer for a forward's layers (`AttentionRequest.layer_sums`)."""

    whole: torch.Tensor       # (L, *shape) float32
    views: tuple              # its L layers
    shape: tuple[int, ...]
    device: torch.device
    given: set                # the layers handed a view


def gather(per_layer: list[torch.Tensor]) -> torch.Tensor:
    """Stack per-layer captures on the first layer's device: a model spread over devices
    (device_map) records each layer on its own device."""
    device = per_layer[0].device
    return torch.stack([t if t.device == device else t.to(device) for t in per_layer])
