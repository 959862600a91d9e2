"""What the analysis reads: one batch row of a trace, one step at a time.

The analysis never needs a model or torch, only these arrays per step. Two implementations:

- `ArraySource`: plain numpy arrays (notebooks, tests, anything that is not a trace file);
- `TraceSource`: a `sinklens.open_trace(...)` trace (Contract 4), read lazily step by step,
  so a 512-step × 32-layer × 32-head × 600-token trace is never held in memory at once.

Both expose the same small interface (`StepData` per step plus metadata), so every function in
`sinklens.analysis` and `sinklens.report` works on either.
"""
from __future__ import annotations

from dataclasses import dataclass, field
import numpy as np

from sinklens.trace.layout import TraceLayout
from sinklens.trace.reader import as_numpy


class AnalysisInputError(ValueError):
    """The arrays / trace handed to the analysis do not fit (shape, range, empty)."""


class ReadoutNotAvailable(AnalysisInputError):
    """A mechanism readout the run did not record (its flag was off) or that does not apply to it (a
    ranking by masked queries in a run without masked query rows): nothing is wrong, the report lists
    it apart from the figures it could not draw."""


@dataclass
class StepData:
    """One step of one batch row. S = number of canvas positions at this step (padded included)."""

    step: int                       # global step number (the trace's `step` column)
    received: np.ndarray            # (L, H, S) float32, r_j = sum over real query rows of A[i, j]
    tokens: np.ndarray              # (S,) int
    is_masked: np.ndarray           # (S,) bool, mask state fed to the model
    key_mask: np.ndarray            # (S,) bool, real (non-pad) positions
    query_positions: np.ndarray     # (Q,) int, absolute positions of the query rows that were summed
    received_groups: np.ndarray | None = None  # (G, L, H, S) float32 per query group, or None
    # (L, H) float32 attention the model's learned sink logits took (gpt-oss), summed over the same
    # query rows as `received` (received.sum(-1) + learned_sink = number of query rows); None: none
    learned_sink: np.ndarray | None = None
    edited: np.ndarray | None = None  # (S,) bool unmasked tokens rewritten at this step (LLaDA2.1), or None
    commit_prob: np.ndarray | None = None  # (S,) float32 probability of each token committed here (NaN elsewhere), or None
    # mechanism readouts recorded at this step: column -> array in its trace shape (Trace.readout;
    # sinklens/trace/readouts.py); empty when the run recorded none
    readouts: dict = field(default_factory=dict)


@dataclass
class Source:
    """Base class: metadata shared by both sources. Subclasses implement `step_data(index)`."""

    num_steps: int
    num_layers: int
    num_heads: int
    layout: TraceLayout = field(default_factory=TraceLayout)  # causal, prompt length, blocks, query rows
    mask_id: int | None = None
    special_ids: tuple[int, ...] = ()
    group_names: tuple[str, ...] = ()
    label: str = "trace"
    meta: dict = field(default_factory=dict)
    truncated: bool = False           # the run did not close its trace: only its finished steps are here

    # ---- the layout's facts, read everywhere ---------------------------------------------------
    @property
    def causal(self) -> bool:
        return self.layout.causal

    @property
    def block_length(self) -> int | None:   # generation blocks after the prompt (None: no blocks)
        return self.layout.block_length

    @property
    def prompt_length(self) -> int | None:  # first generated position (blocks start here)
        return self.layout.prompt_length

    # ---- interface -------------------------------------------------------------------------
    def step_data(self, index: int) -> StepData:  # index = 0 .. num_steps-1 (not the step number)
        raise NotImplementedError

    def decode(self, ids) -> list[str]:
        return [f"<{int(i)}>" for i in np.atleast_1d(ids)]

    def map(self, index: int, layer: int, head: int) -> np.ndarray:
        raise KeyError(self.no_maps_message())

    def map_slices(self) -> list[tuple[int, int, int]]:
        """(step index, layer, head) of every stored full attention map."""
        return []

    def step_numbers(self) -> list[int]:
        return list(range(self.num_steps))

    # ---- helpers ---------------------------------------------------------------------------
    def no_maps_message(self) -> str:
        # the command-line flag first: a reader of the report ran `sinklens trace`, not Python
        return (f"trace '{self.label}' holds no full attention maps; re-run its prompt alone with `sinklens trace "
                f"--map-slices LAYER:HEAD,...` (e.g. `--map-slices 0:0,3:1`; a corpus run's kept traces have none; "
                f"Python: generate(..., capture=CaptureOptions(map_slices=[(layer, head)]))) to draw attention-map "
                f"figures")

    def missing_map_message(self, index: int, layer: int, head: int) -> str:
        return (f"no map for step index {index}, layer {layer}, head {head} in trace '{self.label}'; stored "
                f"(step index, layer, head): {self.map_slices()}")

    def check_layer_head(self, layer: int | None, head: int | None) -> None:
        for name, x in (("layer", layer), ("head", head)):   # '1' or 1.5 would fail later as numpy's index error
            if x is not None and (isinstance(x, bool) or not isinstance(x, (int, np.integer))):
                raise AnalysisInputError(f"{name} must be an int (0-based), got {x!r}")
        if layer is not None and not 0 <= int(layer) < self.num_layers:
            raise AnalysisInputError(f"layer {layer} out of range: trace '{self.label}' has "
                                     f"{self.num_layers} layers (0..{self.num_layers - 1})")
        if head is not None and not 0 <= int(head) < self.num_heads:
            raise AnalysisInputError(f"head {head} out of range: trace '{self.label}' has "
                                     f"{self.num_heads} heads (0..{self.num_heads - 1})")

    def check_index(self, index: int) -> None:
        if not 0 <= int(index) < self.num_steps:
            raise AnalysisInputError(f"step index {index} out of range: trace '{self.label}' has "
                                     f"{self.num_steps} steps (0..{self.num_steps - 1})")


def _check_nonempty(num_steps: int, label: str) -> None:
    if num_steps == 0:
        raise AnalysisInputError(f"trace '{label}' is empty: it has no steps to analyse")


class ArraySource(Source):
    """Plain arrays of one batch row.

    received: (T, L, H, S) column sums; tokens: (T, S) int; is_masked / key_mask: (T, S) bool
    (defaults all False / all True); query_positions: per-step list of 1-D int arrays (default:
    every real position, i.e. a bidirectional DLM step); received_groups: (T, G, L, H, S);
    maps: {(step index, layer, head): (S_q, S_k)}; vocab: {id: string}; learned_sink: (T, L, H)
    attention taken by learned sink logits (gpt-oss), or None; readouts: {column: per-step arrays
    (T, ...) or a list of T arrays} in the trace's shapes (`Trace.readout`).
    """

    def __init__(self, received, tokens, *, is_masked=None, key_mask=None, query_positions=None,
                 received_groups=None, group_names=("masked", "unmasked"), maps=None, vocab=None,
                 causal=False, mask_id=None, special_ids=(), block_length=None, prompt_length=None,
                 label="arrays", meta=None, learned_sink=None, readouts=None):
        received = np.asarray(received, dtype=np.float32)
        if received.ndim != 4:
            raise AnalysisInputError(f"received must be (T, L, H, S), got shape {received.shape}")
        T, L, H, S = received.shape
        _check_nonempty(T, label)
        tokens = np.asarray(tokens)
        if tokens.shape != (T, S):
            raise AnalysisInputError(f"tokens must be (T, S) = {(T, S)} like received, got {tokens.shape}")
        is_masked = np.zeros((T, S), bool) if is_masked is None else np.asarray(is_masked, bool)
        key_mask = np.ones((T, S), bool) if key_mask is None else np.asarray(key_mask, bool)
        for name, arr in (("is_masked", is_masked), ("key_mask", key_mask)):
            if arr.shape != (T, S):
                raise AnalysisInputError(f"{name} must be (T, S) = {(T, S)}, got {arr.shape}")
        if received_groups is not None:
            received_groups = np.asarray(received_groups, dtype=np.float32)
            if received_groups.ndim != 5 or received_groups.shape[0] != T or received_groups.shape[2:] != (L, H, S):
                raise AnalysisInputError(f"received_groups must be (T, G, L, H, S) with (T, L, H, S) = "
                                         f"{(T, L, H, S)}, got {received_groups.shape}")
        if learned_sink is not None:
            learned_sink = np.asarray(learned_sink, dtype=np.float32)
            if learned_sink.shape != (T, L, H):
                raise AnalysisInputError(f"learned_sink must be (T, L, H) = {(T, L, H)}, got {learned_sink.shape}")
        if query_positions is not None and len(query_positions) != T:
            raise AnalysisInputError(f"query_positions must hold one array per step ({T}), got {len(query_positions)}")
        try:
            layout = TraceLayout(causal=causal, prompt_length=prompt_length, block_length=block_length)
        except ValueError as e:
            raise AnalysisInputError(str(e)) from None
        super().__init__(num_steps=T, num_layers=L, num_heads=H, layout=layout, mask_id=mask_id,
                         special_ids=tuple(special_ids),
                         group_names=tuple(group_names) if received_groups is not None else (),
                         label=label, meta=dict(meta or {}))
        self._received, self._tokens, self._is_masked, self._key_mask = received, tokens, is_masked, key_mask
        self._qpos = query_positions
        self._groups = received_groups
        self._learned_sink = learned_sink
        self._readouts = dict(readouts or {})
        for name, per_step in self._readouts.items():
            if len(per_step) != T:
                raise AnalysisInputError(f"readout {name} must hold one array per step ({T}), got {len(per_step)}")
        self._maps = dict(maps or {})
        self._vocab = {int(k): v for k, v in (vocab or {}).items()}

    def step_data(self, index: int) -> StepData:
        self.check_index(index)
        q = (np.flatnonzero(self._key_mask[index]) if self._qpos is None
             else np.asarray(self._qpos[index], dtype=np.int64).reshape(-1))
        return StepData(step=index, received=self._received[index], tokens=self._tokens[index],
                        is_masked=self._is_masked[index], key_mask=self._key_mask[index], query_positions=q,
                        received_groups=None if self._groups is None else self._groups[index],
                        learned_sink=None if self._learned_sink is None else self._learned_sink[index],
                        readouts={k: np.asarray(v[index]) for k, v in self._readouts.items()})

    def decode(self, ids) -> list[str]:
        return [self._vocab.get(int(i), f"<{int(i)}>") for i in np.atleast_1d(ids)]

    def map(self, index: int, layer: int, head: int) -> np.ndarray:
        self.check_index(index)
        self.check_layer_head(layer, head)
        if not self._maps:
            raise KeyError(self.no_maps_message())
        if (index, layer, head) not in self._maps:
            raise KeyError(self.missing_map_message(index, layer, head))
        return np.asarray(self._maps[(index, layer, head)], dtype=np.float32)

    def map_slices(self) -> list[tuple[int, int, int]]:
        return sorted(self._maps)


class TraceSource(Source):
    """One batch row of a `sinklens.open_trace(...)` trace, read lazily (Contract 4)."""

    def __init__(self, trace, row: int = 0, label: str | None = None):
        import os

        meta = dict(trace.meta)
        label = label or os.path.splitext(os.path.basename(getattr(trace, "path", "trace")))[0]
        _check_nonempty(trace.num_steps, label)
        if not 0 <= row < max(trace.batch_size, 1):
            raise AnalysisInputError(f"row {row} out of range: trace '{label}' has batch size {trace.batch_size}")
        super().__init__(num_steps=trace.num_steps, num_layers=trace.num_layers, num_heads=trace.num_heads,
                         label=label, meta=meta, **trace_facts(meta, label))
        self.trace, self.row = trace, row
        self.truncated = bool(getattr(trace, "truncated", False))
        self._steps = trace.steps

    def step_numbers(self) -> list[int]:
        return list(self._steps)

    def step_data(self, index: int) -> StepData:
        self.check_index(index)
        t, s = self.trace, self._steps[index]
        tokens = np.asarray(t.tokens(s, self.row))
        mask = t.attention_mask(s, self.row)
        masked = t.is_masked(s, self.row)
        q = t.query_positions(s, self.row)
        try:
            received = t.received(s, self.row)
        except KeyError:
            raise AnalysisInputError(f"trace '{self.label}' step {s} holds no received attention: the run did not "
                                     f"capture attention (trace it with capture on)") from None
        data = StepData(step=s, received=received, tokens=tokens,
                        is_masked=np.zeros(tokens.shape, bool) if masked is None else np.asarray(masked, bool),
                        key_mask=np.ones(tokens.shape, bool) if mask is None else np.asarray(mask, bool),
                        query_positions=(np.flatnonzero(mask) if q is None else np.asarray(q, np.int64)),
                        received_groups=t.received_groups(s, self.row),
                        learned_sink=t.learned_sink(s, self.row) if hasattr(t, "learned_sink") else None,
                        edited=t.edited(s, self.row) if hasattr(t, "edited") else None,
                        commit_prob=t.commit_prob(s, self.row) if hasattr(t, "commit_prob") else None,
                        readouts=t.readouts(s, self.row) if hasattr(t, "readouts") else {})
        if hasattr(t, "release_pages"):
            t.release_pages()  # one step resident at a time, not the whole memory-mapped file
        return data

    def decode(self, ids) -> list[str]:
        return self.trace.decode(ids)

    def map(self, index: int, layer: int, head: int) -> np.ndarray:
        self.check_index(index)
        self.check_layer_head(layer, head)
        if not self.map_slices():
            raise KeyError(self.no_maps_message())
        if (index, layer, head) not in self.map_slices():
            raise KeyError(self.missing_map_message(index, layer, head))
        return self.trace.map(self._steps[index], layer, head, self.row)

    def map_slices(self) -> list[tuple[int, int, int]]:
        if not hasattr(self, "_map_slices"):
            import pyarrow.compute as pc

            out, index_of = [], {s: i for i, s in enumerate(self._steps)}
            for batch in self.trace.table().to_batches():
                col = batch.column("maps")
                if col.null_count == len(col):
                    continue
                flat = pc.list_flatten(col)                       # struct<layer, head, values>
                parents = as_numpy(pc.list_parent_indices(col))  # batch row of each map
                steps, rows = as_numpy(batch.column("step")), as_numpy(batch.column("row"))
                for p, layer, head in zip(parents, as_numpy(flat.field("layer")), as_numpy(flat.field("head"))):
                    if rows[p] == self.row:
                        out.append((index_of[int(steps[p])], int(layer), int(head)))
            self._map_slices = sorted(out)
        return self._map_slices


def trace_facts(meta: dict, label: str) -> dict:
    """The Source fields a trace's metadata gives: layout, mask id, special ids, query groups."""
    try:
        layout = TraceLayout.from_meta(meta)   # written by the sampler; derived for older traces
    except (TypeError, ValueError) as e:
        raise AnalysisInputError(f"trace '{label}': bad layout metadata: {e}") from None
    special = [meta.get(k) for k in ("eos_id", "pad_id", "eot_id", "bos_id")]
    special += list((meta.get("model") or {}).get("special_ids") or [])
    return dict(layout=layout, mask_id=meta.get("mask_id"), special_ids=tuple(int(s) for s in special if s is not None),
                group_names=tuple(meta.get("query_groups") or ()))


def as_source(obj, row: int = 0, label: str | None = None) -> Source:
    """A `Source` from a Source, a Trace, or a trace path."""
    if isinstance(obj, Source):
        return obj
    if isinstance(obj, (str, bytes)) or hasattr(obj, "__fspath__"):
        from sinklens.trace.reader import open_trace

        return TraceSource(open_trace(obj), row=row, label=label)
    if hasattr(obj, "received") and hasattr(obj, "steps"):
        return TraceSource(obj, row=row, label=label)
    raise AnalysisInputError(f"cannot analyse a {type(obj).__name__}: pass a trace path, a Trace or an ArraySource")

