"""How a run's steps are laid out, in words that hold for every family and sampler.

The sampler knows these facts and writes them (`layout` in the trace metadata); the analysis
reads them and never guesses from a sampler's own argument names. A new sampler (block
diffusion, a canvas of random tokens, an encoder's single forward) fills the same fields; the
model's own attention facts (windows, blocks) are added by the trace plumbing
(`SinkModel.attention_layout`), so the sink rule can recompute from the trace alone which keys
each summed query could see (`visibilities`, sinklens/rule/spec.py).

    causal         query i sees keys j <= i only (ARM decoding); False: bidirectional
    prompt_length  first generated position (the padded prompt length); None: unknown / no prompt
    block_length   generation proceeds in blocks of this many positions after the prompt
                   (LLaDA's semi-autoregressive blocks); None: one block over the whole answer
    query_rows     which query rows a step's `received` sums (the exact rows per step are in the
                   `query_positions` column): "all" = every real position (a bidirectional step),
                   "newest" = the newest token only (ARM decoding; the prefill step: the prompt),
                   "prefix" = every row of the prefix (ARM with capture_prefix),
                   "block" = the current block's rows only (DiffusionGemma's canvas: its queries
                   are the canvas, its keys the cached prefix + the canvas; block diffusion)
    attention_block  block-causal attention: a query sees the keys of its own and earlier blocks
                   of this size, counted from position 0; None: no attention blocks
    windows        per layer, a sliding window (int) or None (full attention); None: no windows
    window_kind    what a window keeps: "causal", "symmetric" or "cache" (rule/spec.py's
                   `Visibility`); None: "causal" for causal runs, else "symmetric"
"""
from __future__ import annotations

import operator
from dataclasses import dataclass, fields

from sinklens.rule.spec import WINDOW_KINDS, Visibility, layer_visibilities

QUERY_ROWS = ("all", "newest", "prefix", "block")
META_KEY = "layout"


@dataclass(frozen=True)
class TraceLayout:
    causal: bool = False
    prompt_length: int | None = None
    block_length: int | None = None
    query_rows: str = "all"
    attention_block: int | None = None
    windows: tuple[int | None, ...] | None = None
    window_kind: str | None = None

    def __post_init__(self):
        if self.query_rows not in QUERY_ROWS:
            raise ValueError(f"query_rows must be one of {QUERY_ROWS}, got {self.query_rows!r}")
        if self.window_kind is not None and self.window_kind not in WINDOW_KINDS:
            raise ValueError(f"window_kind must be one of {WINDOW_KINDS} or None, got {self.window_kind!r}")
        object.__setattr__(self, "causal", bool(self.causal))
        if self.windows is not None:
            object.__setattr__(self, "windows", tuple(None if w is None else _index("windows", w)
                                                      for w in self.windows))
        for name in ("prompt_length", "block_length", "attention_block"):
            v = getattr(self, name)
            if v is None:
                continue
            try:
                v = operator.index(v)       # ints, numpy ints, torch.Size entries; not 8.0, not "8"
            except TypeError:
                v = -1
            if isinstance(v, bool) or v < 0:
                raise ValueError(f"{name} must be a non-negative int or None, got {getattr(self, name)!r}")
            object.__setattr__(self, name, int(v))

    def visibilities(self, num_layers: int) -> list[Visibility]:
        """Which keys a query could see, one `Visibility` per layer (the sink rule's input)."""
        return layer_visibilities(num_layers, causal=self.causal, attention_block=self.attention_block,
                                  windows=self.windows, window_kind=self.window_kind)

    def with_model_facts(self, facts: dict) -> "TraceLayout":
        """This layout with the model's attention facts filled in where the sampler left them None."""
        own = self._values()
        return TraceLayout(**{**{k: v for k, v in facts.items() if k in own and v is not None},
                              **{k: v for k, v in own.items() if v is not None}})

    def to_meta(self) -> dict:
        d = self._values()
        d["windows"] = None if self.windows is None else list(self.windows)
        return d

    def _values(self) -> dict:
        """field -> value (`asdict` without its deep copies: every value here is immutable)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_meta(cls, meta: dict) -> "TraceLayout":
        """The layout a trace's metadata records; older traces (without `layout`) get it derived."""
        stored = meta.get(META_KEY)
        if isinstance(stored, dict):
            return cls(**{f.name: stored[f.name] for f in fields(cls) if f.name in stored})
        return _legacy(meta)


def _index(name: str, v) -> int:
    """A positive int (numpy / torch ints too); not 8.0, not "8", not True."""
    try:
        i = operator.index(v)
    except TypeError:
        i = -1
    if isinstance(v, bool) or i < 1:
        raise ValueError(f"{name} entries must be positive ints or None, got {v!r}")
    return int(i)


def _legacy(meta: dict) -> TraceLayout:
    """Traces written before `layout`: `causal` and `prompt_length` were top-level keys (for a while
    `block_length` too); before that, blocks were only in the LLaDA sampler's own arguments
    (gen_length, block_length), and only the ARM sampler ("arm") was causal."""
    sampler = meta.get("sampler") or {}
    args = sampler.get("args", sampler) if isinstance(sampler, dict) else {}
    args = args if isinstance(args, dict) else {}
    causal = meta.get("causal")
    if causal is None:
        causal = isinstance(sampler, dict) and sampler.get("name") == "arm"
    gen = args.get("gen_length")
    if "block_length" in meta:
        block = meta["block_length"]
    else:
        block = args.get("block_length")
        block = block if block and gen and block < gen else None
    seq_len = int(meta.get("seq_len") or 0)
    if meta.get("prompt_length") is not None:
        prompt = meta["prompt_length"]
    else:
        prompt = seq_len - int(gen) if gen and seq_len else None
    rows = meta.get("arm_query_rows") or ("newest" if causal else "all")
    return TraceLayout(causal=bool(causal), prompt_length=prompt, block_length=block or None, query_rows=rows)
