"""`sinklens eval --attention-stats`: each eval row's generations reduced to a corpus file.

    sinklens eval --model tiny-dlm --task arith --mask-topk 0,1 --attention-stats --out eval-out
    sinklens report eval-out/tiny-dlm/arith/k1/corpus/corpus.jsonl --out report-k1/

Every evaluated sample of a row (K, control) is generated with a trace written to a scratch
file, reduced exactly as `sinklens trace --prompts` reduces a prompt (`corpus.reduce_trace`) and
written as one fsynced line; the scratch trace is then deleted, except for the `keep_traces`
samples chosen evenly over the row, kept in `traces/`. The row's corpus folder `<run dir>/corpus/`
has the corpus mode's layout (`samples.rank<r>.jsonl`, `traces/`, `corpus.jsonl` merged by
`corpus.merge`).

Resume: the line is written before the sample's eval record, so a sample whose record is on
disk has its corpus line too; a sample redone after a kill writes its line again, and the merge
keeps the first line of an id (`corpus.finished`): nothing counts twice.

The runner imports this module for every eval; the corpus module (and with it the analysis,
numpy, pyarrow) is imported inside the functions, so an eval without the option does not load
them (tests/test_eval_startup.py).
"""
from __future__ import annotations

import os

from sinklens.eval import records
from sinklens.samplers.base import CaptureOptions

FOLDER = "corpus"   # <run dir>/corpus/: the row's corpus folder


def eval_capture(m, arm_rule: str) -> CaptureOptions:
    """What a traced eval records: what the masking hook reads (received attention, no masked /
    unmasked query split; ARM prefix rule: every prefix row), the same for every row of the eval
    so that the rows' corpora compare."""
    return CaptureOptions(query_groups=False, capture_prefix=not m.is_diffusion and arm_rule == "prefix")


def for_row(cfg, m, run_dir: str, rank: int, meta: dict, n_items: int) -> "RowCorpus | None":
    """The corpus folder of an eval row (`cfg`: its EvalConfig, `meta`: the row's config.json), in
    the masking rule's units and ε; None without --attention-stats."""
    if not cfg.attention_stats:
        return None
    from sinklens.eval import corpus

    head = corpus.header(m, cfg.model, meta["sampler"], meta["settings"], cfg.mask_units, cfg.sink_eps,
                         eval_capture(m, cfg.arm_rule))
    return RowCorpus(run_dir, rank, {**head, "seed": cfg.seed, "skipped": meta["data_errors"],
                                     "eval": {k: meta[k] for k in ("task", "mask_topk", "masking")}},
                     n_items, cfg.keep_traces)


class RowCorpus:
    """The corpus folder of one eval row, for one rank: `path(i)` is where sample i's trace goes,
    `add(...)` reduces it and writes its line, `merge()` writes corpus.jsonl (main process)."""

    def __init__(self, run_dir: str, rank: int, meta: dict, n_items: int, keep_traces: int):
        from sinklens.eval import corpus

        self.corpus = corpus
        self.dir = os.path.join(run_dir, FOLDER)
        self.keep = corpus.kept_indices(n_items, keep_traces)
        self.meta = {**meta, "n_expected": n_items, "kept_traces": [corpus.trace_name(i) for i in sorted(self.keep)]}
        self.scratch = os.path.join(self.dir, "traces", f".scratch.rank{rank}.arrow")
        self.rank = rank
        self.out = None

    def __enter__(self) -> "RowCorpus":
        os.makedirs(os.path.join(self.dir, "traces"), exist_ok=True)
        self.out = records.RecordWriter(os.path.join(self.dir, f"samples.rank{self.rank}.jsonl")).__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.out.__exit__(*exc)
        if os.path.exists(self.scratch):
            os.remove(self.scratch)

    def path(self, index: int) -> str:
        return os.path.join(self.dir, "traces", self.corpus.trace_name(index)) if index in self.keep else self.scratch

    def add(self, item: dict, index: int, ids: list[int], text: str) -> None:
        """Reduce sample `index`'s trace (at `path(index)`) and write its line (fsynced)."""
        path = self.path(index)
        parts = self.corpus.reduce_trace(path, self.meta["units"], self.meta["sink_eps"])
        keep = index in self.keep
        self.out.write({"id": item["id"], "index": index, "line": item.get("_line"), "prompt_tokens": len(ids),
                        "steps": int(parts[self.meta["units"]]["steps"]["steps"]), "text": text,
                        "trace": os.path.relpath(path, self.dir) if keep else None, "parts": parts})
        if not keep:
            os.remove(path)

    def merge(self) -> str:
        return self.corpus.merge(self.dir, self.meta)
