"""What a step records: the capture options, and the step's `AttentionRequest` built from them
and the hooks' instructions (the masked / unmasked query split included).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, replace

import torch

from sinklens.attention.request import ROUTES, AttentionRequest
from sinklens.samplers.hooks import Hooks
from sinklens.trace.readouts import ReadoutOptions

QUERY_GROUP_NAMES = ["masked", "unmasked"]  # group ids 0 / 1 of the masked/unmasked split


@dataclass
class CaptureOptions(ReadoutOptions):
    """What to record per step when attention is captured (for a trace or a hook). The mechanism
    readouts (value norms, ..., the logit lens: off by default) are the fields of `ReadoutOptions`."""

    received: bool = True  # r_j per layer / head
    query_groups: bool | None = None  # split r_j by masked / unmasked queries (None: on for diffusion models)
    map_slices: tuple[tuple[int, int], ...] = ()  # (layer, head) whose full maps are kept
    map_steps: tuple[int, ...] | None = None  # steps at which maps are kept (None = every step)
    capture_prefix: bool = False  # ARM: capture all prefix rows at every decoding step, not only the newest
    query_chunk: int | None = None  # queries per chunk in the capture path (peak memory); None = automatic
    route: str = "auto"  # capture route: "exact", "lse", "triton" or "auto" (AttentionRequest.route)
    received_dtype: str = "float16"  # stored precision in the trace

    def __post_init__(self):
        super().__post_init__()
        # checked here, not only in AttentionRequest: build_request copies query_chunk onto an
        # existing request, and a chunk < 1 would silently capture nothing (all-zero attention)
        chunk = self.query_chunk
        if chunk is not None and (isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1):
            raise ValueError(f"query_chunk must be a positive integer or None (automatic), got {chunk!r}")
        if self.route not in ROUTES:
            raise ValueError(f"route must be one of {', '.join(ROUTES)}, got {self.route!r}")


def build_request(
    hook_request: AttentionRequest | None,
    capture: CaptureOptions | None,
    step: int,
    query_mask: torch.Tensor | None,  # (B, S_q) bool real query rows
    query_groups: torch.Tensor | None,  # (B, S_q) long group ids, -1 = none
) -> AttentionRequest | None:
    """The step's AttentionRequest: the hooks' instructions plus what `capture` asks to record."""
    if capture is None:
        return hook_request
    req = hook_request if hook_request is not None else AttentionRequest()
    req.capture = req.capture or capture.received
    req.query_chunk = capture.query_chunk
    req.route = capture.route
    if query_mask is not None and req.query_mask is None:
        req.query_mask = query_mask
    if query_groups is not None and req.query_groups is None:
        # the groups put every row of `query_mask` in one (masked_unmasked_groups): they cover the summed
        # rows unless a hook chose other rows
        req.groups_cover_rows = req.query_mask is query_mask
        req.query_groups = query_groups
        req.num_groups = len(QUERY_GROUP_NAMES)
    for name, value in capture.readouts().items():     # mechanism readouts: the options' own fields
        if value:
            setattr(req, name, tuple(value) if isinstance(value, list) else value)
    if capture.map_slices and (capture.map_steps is None or step in capture.map_steps):
        req.map_slices = tuple(sorted(set(req.map_slices) | {(int(l), int(h)) for l, h in capture.map_slices}))
    return req


def masked_unmasked_groups(is_masked: torch.Tensor, real: torch.Tensor | None = None) -> torch.Tensor:
    """(B, S) long query group per position: 0 masked, 1 unmasked, -1 padding (`real` False; None:
    every position is real)."""
    groups = torch.where(is_masked, 0, 1)
    return groups if real is None else torch.where(real, groups, -1)


def take_rows(req: AttentionRequest | None, rows: int) -> AttentionRequest | None:
    """A view of `req` restricted to the first `rows` batch rows (CFG runs a doubled batch and
    records only its conditional half)."""
    return None if req is None else req.first_rows(rows)


def repeat_rows(req: AttentionRequest | None, times: int) -> AttentionRequest | None:
    """Tile the per-row instructions of `req` `times` times along the batch (CFG's doubled batch)."""
    if req is None:
        return None
    cat = lambda t, dim=0: None if t is None else torch.cat([t] * times, dim=dim)  # noqa: E731
    req.query_mask = cat(req.query_mask)
    req.query_groups = cat(req.query_groups)
    req.blocked = cat(req.blocked, 1)  # (L, B, H, S)
    return req


def setup_hooks(hook, trace, capture: CaptureOptions | None, diffusion: bool):
    """(user Hooks, CaptureOptions or None): capture whenever a trace or a hook wants attention;
    the masked/unmasked split is on by default for diffusion models, unless no trace is written and
    every hook that reads the attention says it does not use the split (`wants_query_groups = False`:
    the masking policy, which ranks on all rows)."""
    hooks = Hooks(hook if isinstance(hook, (list, tuple)) else [hook])
    if capture is not None and not isinstance(capture, CaptureOptions):
        raise TypeError(f"capture must be a CaptureOptions (sinklens.samplers.CaptureOptions(...)) or None, got "
                        f"{type(capture).__name__}")
    if trace is not None and not isinstance(trace, (str, os.PathLike)) and not hasattr(trace, "decode"):  # a writer
        raise TypeError(f"trace must be a file path (e.g. 'run.arrow'), a TraceWriter or None, got {type(trace).__name__}")
    if capture is None and (trace is not None or hooks.want_attention):
        capture = CaptureOptions()
    if capture is not None and capture.query_groups is None:
        readers = [h for h in hooks.hooks if getattr(h, "wants_attention", False)]
        split = trace is not None or not readers or any(getattr(h, "wants_query_groups", True) for h in readers)
        capture = replace(capture, query_groups=diffusion and split)
    return hooks, capture
