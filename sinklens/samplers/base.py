"""What every sampler shares: the per-step hook protocol, capture options, the output object,
and the trace plumbing (docs/design.md, Contract 3).

A step of any sampler is: ask the hooks for instructions (`before_step`, e.g. keys to block),
build one `AttentionRequest`, run the forward pass, choose tokens, then hand a `StepEvent` to
the hooks (`after_step`). The trace writer is one such hook.
"""
from __future__ import annotations

import inspect

import os
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any, Iterable

import torch

from sinklens.attention.request import ROUTES, AttentionRequest
from sinklens.trace.layout import TraceLayout
from sinklens.trace.readouts import ReadoutOptions

QUERY_GROUP_NAMES = ["masked", "unmasked"]  # group ids 0 / 1 of the masked/unmasked split


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


@dataclass
class GenerateOutput:
    sequences: torch.Tensor  # (B, S_total) long
    history: list[torch.Tensor] = field(default_factory=list)  # (B, S_total) x after each step
    trace_path: str | None = None
    num_steps: int = 0
    text: list[str] | None = None  # per row: the generated text, cut at the first end token (None: no tokenizer)

    @property
    def trace(self):
        """The written trace, opened lazily (None when no trace was asked for)."""
        if self.trace_path is None:
            return None
        from sinklens.trace.reader import open_trace

        return open_trace(self.trace_path)


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
        self._wants_mask = {id(h) for h in self.hooks if hasattr(h, "before_step")
                            and "attention_mask" in inspect.signature(h.before_step).parameters}

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
        req.query_groups = query_groups
        req.num_groups = len(QUERY_GROUP_NAMES)
    for name, value in capture.readouts().items():     # mechanism readouts: the options' own fields
        if value:
            setattr(req, name, tuple(value) if isinstance(value, list) else value)
    if capture.map_slices and (capture.map_steps is None or step in capture.map_steps):
        req.map_slices = tuple(sorted(set(req.map_slices) | {(int(l), int(h)) for l, h in capture.map_slices}))
    return req


def masked_unmasked_groups(is_masked: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
    """(B, S) long query group per position: 0 masked, 1 unmasked, -1 padding."""
    groups = torch.where(is_masked, 0, 1)
    return torch.where(real, groups, torch.full_like(groups, -1))


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


def attention_is_causal(model) -> bool:
    """Whether the model's family attends causally (its adapter's attention layout, never its name)."""
    return bool(getattr(getattr(model, "family", None), "causal", False))


def open_trace_writer(trace, model, sampler: str, args: dict, input_ids: torch.Tensor,
                      capture: CaptureOptions, seq_len: int, *, layout, extra: dict | None = None):
    """A TraceWriter for `trace` (a path or an existing writer), with the run metadata filled in.
    layout: the run's `TraceLayout` (causal, prompt length, blocks, query rows): every sampler
    states it, so the analysis never reads a sampler's own argument names."""
    if trace is None:
        return None
    from sinklens.trace.schema import replaceable  # pyarrow: loaded when a trace is written, not before
    from sinklens.trace.writer import TraceWriter

    if hasattr(model, "attention_layout"):  # windows, attention blocks: what the sink rule needs
        layout = layout.with_model_facts(model.attention_layout)

    tok = getattr(model, "tokenizer", None)
    decode = None
    if tok is not None:
        decode = lambda ids: [t or "" for t in tok.convert_ids_to_tokens([int(i) for i in ids])]  # noqa: E731
    if isinstance(trace, (str, os.PathLike)):
        if not replaceable(trace):
            raise ValueError(f"trace={os.fspath(trace)!r} exists and is not a trace; not overwriting it (choose "
                             "another path such as run.arrow, or remove the file)")
        writer = TraceWriter(trace, received_dtype=capture.received_dtype, decode=decode)
    else:
        writer = trace
        if writer.decode is None:
            writer.decode = decode
    prompt = None
    if tok is not None:
        try:
            prompt = tok.batch_decode(input_ids.tolist())
        except Exception:  # a tokenizer that cannot decode some ids: keep the ids only
            prompt = None
    meta = dict(
        model=getattr(model, "source", None),
        family=getattr(getattr(model, "family", None), "name", None),
        sampler={"name": sampler, "args": {k: _jsonable(v) for k, v in args.items()}},
        seed=torch.initial_seed(),
        prompt=prompt,
        prompt_ids=input_ids.tolist(),
        num_layers=getattr(model, "num_layers", None),
        num_heads=getattr(model, "num_heads", None),
        batch_size=int(input_ids.shape[0]),
        seq_len=int(seq_len),
        mask_id=getattr(model, "mask_id", None),
        eos_id=getattr(model, "eos_id", None),
        eot_id=getattr(model, "eot_id", None),
        pad_id=getattr(model, "pad_id", None),
        layout=layout.to_meta(),
        causal=layout.causal,                # also top level, as before `layout` (readers of older traces)
        prompt_length=layout.prompt_length,
        query_groups=QUERY_GROUP_NAMES if capture.query_groups else None,
        map_slices=[list(s) for s in capture.map_slices],
        readouts={k: v for k, v in capture.readouts().items() if v},
    )
    meta.update(extra or {})
    for k, v in meta.items():
        if k not in writer.meta:
            writer.meta[k] = v
    return writer


def _jsonable(v):
    if isinstance(v, torch.Tensor):
        return v.tolist()
    if isinstance(v, (str, int, float, bool)) or v is None:
        return v
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    return repr(v)


def cut_at_end(model, new_ids: list[int]) -> list[int]:
    """Generated ids (a list) up to the first end token (EOS, EoT, the model's stop ids)."""
    stops = set(getattr(model, "stop_ids", None) or ()) | {
        i for i in (getattr(model, "eos_id", None), getattr(model, "eot_id", None)) if i is not None}
    return new_ids[:next((i for i, t in enumerate(new_ids) if t in stops), len(new_ids))]


def decode_new(model, new_ids) -> str | None:
    """Text of generated ids (a list), cut at the first end token, special tokens dropped; None
    when the model has no tokenizer."""
    tok = getattr(model, "tokenizer", None)
    if tok is None:
        return None
    return tok.decode(cut_at_end(model, new_ids), skip_special_tokens=True)


def mask_id_of(model, config) -> int:
    """The mask token id a diffusion sampler writes: the config's, else the model's; one line when
    neither names one."""
    mask_id = model.mask_id if config.mask_id is None else config.mask_id
    if mask_id is None:
        raise ValueError("mask_id is None: the model has no mask token; pass mask_id=...")
    return mask_id


def check_top_k(model, top_k: int | None) -> None:
    """top_k above the vocabulary, which the official LLaDA2 / SDAR code fails on inside torch.topk: one
    line instead (None: the sampler does not read top_k)."""
    vocab = model.model.config.get_text_config().vocab_size
    if top_k is not None and top_k > vocab:
        raise ValueError(f"top_k must be at most the vocabulary size ({vocab}), got {top_k}")


def check_inputs(input_ids, attention_mask, total_len: int, max_length: int | None):
    """Validate the prompt batch; returns (input_ids (B, P) long, attention_mask (B, P) or None)."""
    if not isinstance(input_ids, torch.Tensor):
        input_ids = torch.as_tensor(input_ids)
    if input_ids.dim() == 1:
        input_ids = input_ids[None]
    if input_ids.dim() != 2 or input_ids.shape[1] == 0:
        raise ValueError(f"input_ids must be a non-empty (B, P) tensor of token ids, got shape {tuple(input_ids.shape)}")
    if input_ids.dtype.is_floating_point:
        raise ValueError(f"input_ids must hold integer token ids, got dtype {input_ids.dtype}")
    input_ids = input_ids.long()
    if attention_mask is not None:
        attention_mask = torch.as_tensor(attention_mask)
        if attention_mask.dim() == 1:
            attention_mask = attention_mask[None]
        if attention_mask.shape != input_ids.shape:
            raise ValueError(f"attention_mask must have the shape of input_ids {tuple(input_ids.shape)}, "
                             f"got {tuple(attention_mask.shape)}")
    if max_length is not None and total_len > max_length:
        raise ValueError(f"prompt ({input_ids.shape[1]} tokens) + generation = {total_len} tokens exceeds the "
                         f"model's context of {max_length} tokens")
    return input_ids, attention_mask


def make_progress(total: int, progress: bool | None, desc: str):
    """A tqdm bar when `progress` is True, nothing otherwise."""
    if not progress:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit="step")


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


@contextmanager
def run_context(writer, trace, total: int, progress: bool, desc: str):
    """Progress bar + trace lifetime: a writer opened here from a path is closed at the end,
    or left without its end-of-stream marker (truncated) when the run fails."""
    bar = make_progress(total, progress, desc)
    owned = writer is not None and writer is not trace
    failed = False
    try:
        yield bar
    except BaseException:
        failed = True
        if owned:
            writer.abandon()
        raise
    finally:
        if bar is not None:
            if failed:               # Ctrl-C, an error: the bar keeps its total and says so, never 100 %
                bar.set_description(f"{desc} (interrupted)", refresh=False)
            elif bar.n < bar.total:  # stopped early (EOS): the bar ends where the run ended
                bar.total = bar.n
            bar.close()
    if owned:
        writer.close()
