"""The step context every sampler runs its loop in: a sampler is its algorithm plus one `with`.

    with steps(model, capture, trace, hook, name="llada", args=..., input_ids=ids, seq_len=S,
               layout=layout, total=n_steps, progress=progress) as run:
        for ...:
            req = run.request(x, is_masked, real, queries=real)   # the hooks' instructions + capture
            logits = model.forward_logits(x, attention=req)
            ...                                                    # the official algorithm
            run.step(x, is_masked, logits, revealed, after=x)      # hooks, trace, history, progress
    return run.output(x)

`Steps` owns what is not the algorithm: the user's hooks and the trace writer (one `Hooks`), the
capture options, the progress bar, the step counter, the history and the trace's lifetime (a
writer opened here from a path is closed at the end, or left truncated when the run fails). It
also remembers the canvas `request` was given, as the model saw it (a sampler commits into its
canvas in place), and the step's request, so `step` hands both to the hooks.
What the step hands on beside the sampler's own arrays: the probability of every committed token
under the step's logits (`StepEvent.commit_prob`, the trace's `commit_prob` column): the paper's
§5.2 hypothesis reads it (does masking a sink lower the confidence of what is committed?).
"""
from __future__ import annotations

import os
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from sinklens.attention.request import AttentionRequest
from sinklens.samplers.capture import (QUERY_GROUP_NAMES, CaptureOptions, build_request, masked_unmasked_groups,
                                       setup_hooks)
from sinklens.samplers.hooks import Hooks, StepEvent
from sinklens.trace.layout import TraceLayout


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


class Steps:
    """One run's per-step plumbing (module docstring). Made by `steps(...)`, never by a sampler."""

    def __init__(self, hooks: Hooks, capture: CaptureOptions | None, writer, layout: TraceLayout,
                 layout_to_hooks: bool):
        self.hooks = hooks  # the user's hooks and the trace writer, as one
        self.capture = capture
        self.writer = writer
        self.layout = layout
        self._event_layout = layout if layout_to_hooks else None
        self.index = 0  # the step about to run (0-based, counted over the whole run)
        self.history: list[torch.Tensor] = []
        self.bar = None
        self._fed = self._fed_from = self._req = None

    @property
    def split(self) -> bool:
        """Whether the step's request splits the received attention by masked / unmasked queries."""
        return bool(self.capture is not None and self.capture.query_groups)

    def instructions(self, tokens: torch.Tensor, is_masked: torch.Tensor,
                     real: torch.Tensor | None) -> AttentionRequest | None:
        """The hooks' request for the coming step alone (keys to block; None: no instruction). Also
        remembers `tokens` as fed (a copy: the sampler commits into its canvas in place)."""
        self._fed_from, self._fed = tokens, (tokens.clone() if self.hooks else tokens)
        return self.hooks.before_step(self.index, tokens, is_masked, real)

    def record(self, req: AttentionRequest | None, queries: torch.Tensor | None,
               queries_masked: torch.Tensor | None = None, capture: bool = True) -> AttentionRequest | None:
        """`req` plus what the capture options ask to record. queries: (B, S_q) bool real query rows
        (None: no query mask, every row counts); queries_masked: (B, S_q) bool masked state of the query
        rows, for the masked / unmasked split (None: no split); capture=False: the instructions only."""
        groups = None
        if self.split and queries_masked is not None:
            groups = masked_unmasked_groups(queries_masked, queries)
        self._req = build_request(req, self.capture if capture else None, self.index, queries, groups)
        return self._req

    def request(self, tokens: torch.Tensor, is_masked: torch.Tensor, real: torch.Tensor | None, *,
                queries: torch.Tensor | None = None, queries_masked: torch.Tensor | None = None):
        """The step's `AttentionRequest` (None: nothing to do): the hooks' instructions for the canvas
        `tokens` (B, S) with mask state `is_masked` (B, S) and real keys `real` (B, S), plus the
        capture. queries / queries_masked as `record` (queries_masked defaults to `is_masked`, which
        then has the query rows' shape: every position is a query row)."""
        hook_req = self.instructions(tokens, is_masked, real)
        return self.record(hook_req, queries, is_masked if queries_masked is None else queries_masked)

    def step(self, tokens: torch.Tensor, is_masked: torch.Tensor, logits: torch.Tensor, revealed: torch.Tensor, *,
             after: torch.Tensor | None = None, committed: torch.Tensor | None = None,
             attention: AttentionRequest | None = None, grow: bool = False, fresh: tuple[str, ...] = (),
             probs: torch.Tensor | None = None, commits: bool = True, **event) -> None:
        """End the step: the hooks (trace writer included) get its `StepEvent`, `after` (the canvas
        after the step) joins the history, the bar moves, the counter advances.

        tokens (B, S): the canvas fed (when it is the tensor `request` saw, the copy taken then);
        is_masked / revealed (B, S) bool; logits (B, S_q, V) as the sampler used them, row r at
        position `query_positions[b][0] + r` (0 without query_positions); committed (B, S) the token
        ids the step wrote at `revealed` (default: `after`); attention: the step's request when the
        sampler changed it after `request` (CFG's conditional half); grow: a step beyond `total`
        (a sampler whose step count is not known ahead); fresh: the event fields the sampler made for
        this step alone and never changes after it (`StepEvent.fresh`: kept without a copy); probs:
        (B, S) float32, where the sampler has them, the probabilities softmax(logits) gave the tokens
        it committed at `revealed` (LLaDA's low-confidence remasking ranks on them): commit_prob reads
        them there instead of making them again from the logits; commits=False: the step reveals
        nothing in the canvas fed (an ARM appends its token after it), so no commit_prob; event:
        further StepEvent fields (block, attention_mask, query_positions, edited)."""
        if after is not None:
            self.history.append(after.clone())
        if self.hooks:
            own = tokens is self._fed_from   # the copy taken at `instructions`: no one else holds it
            fed = self._fed if own else tokens
            # commit_prob is made here for this event alone; the copy taken at `instructions` is the hooks' own
            fresh = (*fresh, "commit_prob", "tokens") if own else (*fresh, "commit_prob")
            req = self._req if attention is None else attention
            chosen = after if committed is None else committed
            prob = None
            if commits and chosen is not None and self.hooks.want_commit_prob:
                prob = (commit_probabilities(logits, revealed, chosen, event.get("query_positions")) if probs is None
                        else probabilities_at(probs, revealed))
            self.hooks.after_step(StepEvent(step=self.index, tokens=fed, is_masked=is_masked, revealed=revealed,
                                            logits=logits, attention=req, commit_prob=prob,
                                            fresh=fresh,
                                            **{"layout": self._event_layout, **event}))
        self._fed = self._fed_from = self._req = None
        self.index += 1
        if self.bar is not None:
            if grow:
                self.bar.total += 1
            self.bar.update(1)

    def output(self, sequences: torch.Tensor, num_steps: int | None = None) -> GenerateOutput:
        """The run's GenerateOutput: `sequences` (B, S_total), its history and trace path."""
        return GenerateOutput(sequences=sequences, history=self.history,
                              num_steps=self.index if num_steps is None else num_steps,
                              trace_path=None if self.writer is None else self.writer.path)


def probabilities_at(probs: torch.Tensor, revealed: torch.Tensor) -> torch.Tensor | None:
    """(B, S) float32: `probs` (B, S) at the revealed positions, NaN elsewhere; None when the step
    commits nothing (as `commit_probabilities`, from probabilities the sampler made already)."""
    if not bool(revealed.any()):
        return None
    return torch.where(revealed, probs, float("nan"))


def commit_probabilities(logits: torch.Tensor, revealed: torch.Tensor, chosen: torch.Tensor,
                         query_positions=None) -> torch.Tensor | None:
    """(B, S) float32: at each revealed position the probability softmax(logits) gives the token the
    step committed there (`chosen`, (B, >= S) ids), NaN elsewhere; None when the step commits nothing.
    logits (B, S_q, V): row r is position `query_positions[b][0] + r` (contiguous rows), else r."""
    rows, positions = revealed.nonzero(as_tuple=True)  # only the committed rows: N x V, not S x V
    if rows.numel() == 0:   # (the nonzero's size: no separate test of `revealed`, each op counts on a tiny model)
        return None
    at = positions
    if query_positions is not None:
        first = torch.tensor([int(q[0]) if len(q) else 0 for q in query_positions], device=revealed.device)
        at = positions - first[rows]
    picked = logits[rows, at].float()  # (N, V)
    token = chosen[rows, positions].long()
    out = torch.full(revealed.shape, float("nan"), dtype=torch.float32, device=revealed.device)
    out[rows, positions] = picked.log_softmax(-1).gather(-1, token[:, None]).squeeze(-1).exp()
    return out


@contextmanager
def steps(model, capture: CaptureOptions | None, trace, hook, *, name: str, args: dict, input_ids: torch.Tensor,
          seq_len: int, layout: TraceLayout, total: int, progress: bool = False, diffusion: bool = True,
          extra: dict | None = None, layout_to_hooks: bool = False):
    """A run's `Steps` (module docstring). capture / trace / hook / progress: the sampler's arguments
    of those names; name / args: the sampler and its settings (trace metadata); input_ids (B, P) the
    checked prompt; seq_len: the canvas length; layout: the run's TraceLayout (every sampler states
    it; `layout_to_hooks`: also hand it to the hooks with every step, for samplers whose steps see
    other keys than the model's own layout says: blocks, cached rows); total: the planned step count
    (the progress bar's); diffusion: the masked / unmasked split applies; extra: more metadata."""
    hooks, capture = setup_hooks(hook, trace, capture, diffusion=diffusion)
    writer = open_trace_writer(trace, model, name, args, input_ids, capture, seq_len, layout=layout, extra=extra)
    run = Steps(Hooks(hooks.hooks + ([writer] if writer is not None else [])), capture, writer, layout,
                layout_to_hooks)
    with run_context(writer, trace, total, progress, name) as bar:
        run.bar = bar
        yield run


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

    facts = getattr(model, "attention_layout", None)  # windows, attention blocks: what the sink rule needs
    if facts is not None:
        layout = layout.with_model_facts(facts)

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
