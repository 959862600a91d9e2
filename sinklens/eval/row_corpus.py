"""`sinklens eval --attention-stats`: each eval row's generations reduced to a corpus file.

    sinklens eval --model tiny-dlm --task arith --mask-topk 0,1 --attention-stats --out eval-out
    sinklens report eval-out/tiny-dlm/arith/k1/corpus/corpus.jsonl --out report-k1/

Every evaluated sample of a row (K, control) is reduced as `sinklens trace --prompts` reduces a
prompt: each step folded into its parts as the sampler runs (`stream.StreamWriter`, the parts
`corpus.reduce_trace` gives on its trace) and written as one fsynced line. No trace is written,
except for the `keep_traces` samples chosen evenly over the row, kept in `traces/`. The row's
corpus folder `<run dir>/corpus/` has the corpus mode's layout (`samples.rank<r>.jsonl`,
`traces/`, `corpus.jsonl` merged by `corpus.merge`).

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
from sinklens.samplers.capture import CaptureOptions

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
    """The corpus folder of one eval row, for one rank: `writer(i)` is what sample i's generation
    hands its steps to (`trace=`), `add(...)` writes its line, `merge()` writes corpus.jsonl (main process)."""

    def __init__(self, run_dir: str, rank: int, meta: dict, n_items: int, keep_traces: int):
        from sinklens.eval import corpus, stream

        self.corpus, self.stream = corpus, stream
        self.dir = os.path.join(run_dir, FOLDER)
        self.keep = corpus.kept_indices(n_items, keep_traces)
        self.meta = {**meta, "n_expected": n_items, "kept_traces": [corpus.trace_name(i) for i in sorted(self.keep)]}
        self.rank = rank
        self.out = None
        self.current = None     # (index, StreamWriter) of the sample being generated

    def __enter__(self) -> "RowCorpus":
        os.makedirs(os.path.join(self.dir, "traces"), exist_ok=True)
        self.out = records.RecordWriter(os.path.join(self.dir, f"samples.rank{self.rank}.jsonl")).__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self.current is not None:          # a generation that failed: its kept trace stays, marked truncated
            self.current[1].abandon()
        self.out.__exit__(*exc)

    def writer(self, index: int):
        """The StreamWriter sample `index` is generated into (its trace written too when kept)."""
        keep = os.path.join(self.dir, "traces", self.corpus.trace_name(index)) if index in self.keep else None
        self.current = (index, self.stream.StreamWriter(self.meta["units"], self.meta["sink_eps"], keep=keep,
                                                        received_dtype=self.meta["capture"]["received_dtype"]))
        return self.current[1]

    def add(self, item: dict, index: int, ids: list[int], text: str) -> None:
        """Write sample `index`'s line (fsynced): the parts of its generation into `writer(index)`."""
        i, w = self.current
        assert i == index, f"sample {index} was not generated into this row's writer (last: {i})"
        w.close()
        self.current = None
        parts = w.parts()
        self.out.write({"id": item["id"], "index": index, "line": item.get("_line"), "prompt_tokens": len(ids),
                        "steps": int(parts[self.meta["units"]]["steps"]["steps"]), "text": text,
                        "trace": os.path.relpath(w.path, self.dir) if w.path else None, "parts": parts})

    def merge(self) -> str:
        return self.corpus.merge(self.dir, self.meta)
