"""How a run's steps are laid out, in words that hold for every family and sampler.

The sampler knows these facts and writes them (`layout` in the trace metadata); the analysis
reads them and never guesses from a sampler's own argument names. A new sampler (block
diffusion, a canvas of random tokens, an encoder's single forward) fills the same four fields.

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
"""
from __future__ import annotations

import operator
from dataclasses import asdict, dataclass

QUERY_ROWS = ("all", "newest", "prefix", "block")
META_KEY = "layout"


@dataclass(frozen=True)
class TraceLayout:
    causal: bool = False
    prompt_length: int | None = None
    block_length: int | None = None
    query_rows: str = "all"

    def __post_init__(self):
        if self.query_rows not in QUERY_ROWS:
            raise ValueError(f"query_rows must be one of {QUERY_ROWS}, got {self.query_rows!r}")
        object.__setattr__(self, "causal", bool(self.causal))
        for name in ("prompt_length", "block_length"):
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

    def to_meta(self) -> dict:
        return asdict(self)

    @classmethod
    def from_meta(cls, meta: dict) -> "TraceLayout":
        """The layout a trace's metadata records; older traces (without `layout`) get it derived."""
        stored = meta.get(META_KEY)
        if isinstance(stored, dict):
            fields = ("causal", "prompt_length", "block_length", "query_rows")
            return cls(**{k: stored[k] for k in fields if k in stored})
        return _legacy(meta)


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
