"""What every capture route shares: one layer's call, what it asks for, and what a route can record.

A route is one way to compute a layer's attention output and record what the request asks for
(routes/__init__.py keeps the registry and picks one per call). Each declares `Records`: the
captures it can make and the inputs it accepts; a call's `Needs` are read off the request and
the layer, and a route is a candidate for the call only if its declaration covers them.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields

import torch

from sinklens.attention.masks import allowed_keys
from sinklens.attention.request import AttentionRequest

_UNMADE = object()   # Call._allowed before its first read


@dataclass(frozen=True)
class Modifiers:
    """What a layer changes about plain softmax(q k^T * scaling + mask) attention."""

    softcap: float | None = None  # Gemma2: logits -> cap * tanh(logits / cap) before the mask
    sinks: torch.Tensor | None = None  # (H,) gpt-oss: a learned logit per head that joins the softmax, no value

    @property
    def sdpa_can(self) -> bool:
        """sdpa (and so the fused lse and triton kernels) has neither softcapping nor sink logits."""
        return self.softcap is None and self.sinks is None


NO_MODIFIERS = Modifiers()


@dataclass(slots=True)   # (made for every layer: slots store its fields without an instance dict)
class Call:
    """One layer's attention call, as the attention function has checked it."""

    module: torch.nn.Module
    query: torch.Tensor  # (B, H, S_q, D), after RoPE
    key: torch.Tensor  # (B, H_kv, S_k, D), before the GQA repeat
    value: torch.Tensor  # (B, H_kv, S_k, D)
    attention_mask: torch.Tensor | None  # what transformers passed: (B|1, 1, S_q, S_k) bool or additive, or None
    is_causal: bool
    scaling: float
    req: AttentionRequest
    mods: Modifiers
    blocked: torch.Tensor | None  # (B, H, S_k) bool keys blocked in this layer; None: none
    kwargs: dict = field(default_factory=dict)  # what the plain route passes on to the model's own attention
    _allowed: object = field(default=_UNMADE, repr=False)

    @property
    def allowed(self) -> torch.Tensor | None:
        """(B|1, 1|H, S_q, S_k) bool keys each query may see before blocking; None = every key. Made on
        first read: a causal layer without a mask is (S_q, S_k) bools that the compiled route never reads
        (it tells the kernel "causal"), work that grows with S^2 in every layer."""
        if self._allowed is _UNMADE:
            self._allowed = allowed_keys(self.attention_mask, self.is_causal, self.query.shape[2], self.key.shape[2],
                                         self.query.device)
        return self._allowed

    @property
    def blocking(self) -> bool:
        """Keys are blocked and a capture is asked: the would-be sums before blocking are recorded too."""
        return self.req.capture and self.blocked is not None


@dataclass(frozen=True)
class Records:
    """What a route can record, and which inputs it accepts. Each bool: the route handles calls that need it."""

    groups: bool = False  # column sums per query group
    blocking: bool = False  # blocked keys, with the would-be sums before blocking
    keep_self: bool = False  # a blocked key still seen by its own query
    masks: bool = False  # a mask beyond causal / none: padding, sliding windows, blocks
    maps: bool = False  # full (S_q, S_k) maps of chosen heads
    learned_sinks: bool = False  # a learned sink logit per head (gpt-oss)
    softcap: bool = False  # logit soft-capping (Gemma2)
    readouts: frozenset[str] = frozenset()  # readouts made inside the pass: "diagonal", "distance"
    dtypes: frozenset[torch.dtype] = frozenset({torch.float32, torch.bfloat16, torch.float16})
    devices: frozenset[str] = frozenset({"cpu", "cuda"})

    def covers(self, needs: Needs) -> bool:
        for f in fields(Needs):
            want, have = getattr(needs, f.name), getattr(self, f.name, None)
            if f.name == "readouts":
                if not want <= have:
                    return False
            elif f.name == "dtype":
                if want not in self.dtypes:
                    return False
            elif f.name == "device":
                if want not in self.devices:
                    return False
            elif want and not have:
                return False
        return True


@dataclass(frozen=True)
class Needs:
    """What one call asks of a route (the same names as `Records`)."""

    groups: bool
    blocking: bool
    keep_self: bool
    masks: bool
    maps: bool
    learned_sinks: bool
    softcap: bool
    readouts: frozenset[str]
    dtype: torch.dtype
    device: str

    @classmethod
    def of(cls, call: Call) -> Needs:
        req = call.req
        return cls(groups=req.query_groups is not None, blocking=call.blocked is not None,
                   keep_self=call.blocked is not None and req.keep_self,
                   masks=call.attention_mask is not None, maps=bool(req.map_slices),
                   learned_sinks=call.mods.sinks is not None, softcap=call.mods.softcap is not None,
                   readouts=IN_PASS[bool(req.diagonal), bool(req.distance)],
                   dtype=call.query.dtype, device=call.query.device.type)

    @staticmethod
    def key(call: Call) -> tuple:
        """Every value `of` reads, as plain values, plus the route the request names: what the routes
        chosen for `call` depend on (choose_route's memo; cheaper than building a `Needs` per layer).
        A field added to `of` is added here."""
        req, mods, query = call.req, call.mods, call.query
        return (call.blocked is None, call.attention_mask is None, mods.sinks is None, mods.softcap is None,
                query.dtype, query.device.type, req.query_groups is None, req.keep_self, bool(req.map_slices),
                bool(req.diagonal), bool(req.distance), req.route)


# The readouts a route makes inside its pass, as `Needs.readouts` for each (diagonal, distance) request
IN_PASS = {(d, p): frozenset(n for n, on in (("diagonal", d), ("distance", p)) if on)
           for d in (False, True) for p in (False, True)}


class Route:
    """A capture route: `records` declares what it can do; `run` returns the (B, S_q, H, D) output with
    the captures recorded on `call.req`, or None where it declines this call (the next candidate runs)."""

    name: str = ""
    records: Records = Records()
    # (device, dtype) pairs where "auto" may pick this route, in registry order
    auto: frozenset[tuple[str, torch.dtype]] = frozenset()
    fallback: str | None = None  # where a call named for this route goes when the route cannot take it

    def available(self, call: Call) -> bool:
        """Whether the route can run here at all (a library installed, a kernel built); cheap."""
        return True

    def run(self, call: Call) -> torch.Tensor | None:
        raise NotImplementedError
