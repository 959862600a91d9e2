"""Corpus runs: trace many prompts, keep per-(layer, head) totals instead of full traces.

    sinklens trace --model M --prompts prompts.jsonl --out runs/corpus --keep-traces 5
    sinklens report runs/corpus/corpus.jsonl --out report/

Each prompt is generated with the model's own sampler, and each of its steps is folded into its
corpus part as the sampler produces it (sinklens/eval/stream.py: sink rates, Table 2 token counts,
dynamics counts, the ε sweep, every accumulator's `corpus()`, exactly what `reduce_trace` gives on
the prompt's trace), written as one fsynced JSON line. No trace is written, except for the
`keep_traces` prompts chosen evenly over the file, whose full traces go to `traces/`. Memory is
one step's arrays plus O(L·H·(S + bins)) running sums, whatever the number of steps; disk O(N·L·H).

Layout of OUT: `config.json` (the run's settings, what was skipped), `samples.rank<r>.jsonl`
(one line per finished prompt, per process), `traces/<index>.arrow` (the kept traces) and, once
every prompt is done, `corpus.jsonl` (the header line + every prompt in prompt order).

Resume: re-running the same command skips the prompts whose line is on disk (a torn last line
does not count: sinklens/eval/records.py), so a killed run loses at most the prompt it was
tracing and counts nothing twice. Data-parallel: under torchrun / accelerate launch prompt i
goes to rank i % WORLD_SIZE (seed + i on any rank); the main process merges after a barrier.
Bad lines (not JSON, no "prompt" string, a duplicate id) and prompts longer than the context
are skipped, listed as file:line and counted in the header.
"""
from __future__ import annotations

import json
import os
import sys
from dataclasses import asdict

import numpy as np
import torch

from sinklens.analysis.analyze import DEFAULT_EPS_VALUES, AnalysisConfig, analyze
from sinklens.analysis.corpus import FORMAT, prompt_part, to_json
from sinklens.analysis.step_stats import HIST_EDGES
from sinklens.eval import records, rundir
from sinklens.eval.dist import dist_state
from sinklens.eval.corpus_config import CorpusConfig  # noqa: F401  (re-exported: run_corpus's argument)
from sinklens.eval.jsonl import read_jsonl
from sinklens.eval.settings import sampler_settings
from sinklens.eval.stream import StreamWriter
from sinklens.rule.spec import BASELINE_UNITS
from sinklens.samplers.capture import CaptureOptions
from sinklens.samplers.registry import get_config
from sinklens._version import __version__

CORPUS_FILE = "corpus.jsonl"


# What must not change when a run is resumed (the totals would mix two experiments).
_SAME_RUN = ("model", "random_init", "prompts_file", "sampler", "settings", "units", "sink_eps", "seed", "raw", "eps_values",
             "hist_edges")


def run_corpus(cfg: CorpusConfig, model=None) -> str | None:
    """Run (or resume) a corpus; returns the merged corpus file (None on a rank that does not merge)."""
    # 1. Everything that can be wrong with the inputs is found before any file is written.
    items, errors = read_jsonl(cfg.prompts, required=("prompt",),
                               check=lambda r: None if r["prompt"].strip() else "the prompt is empty")
    errors = [str(e) for e in errors]
    if os.path.exists(cfg.out) and not os.path.isdir(cfg.out):
        raise ValueError(f"--out {cfg.out!r} is a file; with --prompts it is the run folder")
    dist = dist_state(cfg.device)
    # 2. The folder locked for this rank before the model loads: a second writer is refused at once
    with rundir.RunLock(cfg.out, dist.rank, who="sinklens trace --prompts"):
        m, items, prompts, settings, meta = _plan(cfg, model, items, errors, dist)
        _write_prompts(cfg, m, items, prompts, settings, meta, dist)
    if dist.world == 1 or "MASTER_ADDR" in os.environ:    # hand-set shards have no group: a later run merges
        dist.barrier()
        if dist.is_main:
            return merge(cfg.out, meta)
    return None


def _plan(cfg: CorpusConfig, model, items: list[dict], errors: list[str], dist):
    """(model, usable items, their prompt ids, sampler settings, the run's header): the model
    loaded (unless given) and every prompt checked against it, nothing written yet."""
    if model is None:
        from sinklens.models.loader import load
        model = load(cfg.model, dtype=cfg.dtype, device=None if cfg.load_args.get("device_map") else
                     cfg.device or dist.device, **cfg.load_args)
    m = model
    if m.tokenizer is None:
        raise ValueError(f"{cfg.model!r} ships no tokenizer; --prompts needs one to read text prompts")
    sampler = m.family.pick_sampler(cfg.sampler, cfg.sampler_args)
    settings, notes = sampler_settings(m, None, sampler=sampler, **cfg.sampler_args)
    gen = get_config(sampler).from_kwargs(**settings).length or 0
    items, prompts = _prepare(m, items, errors, cfg, gen)
    if dist.is_main:
        for line in notes:
            print(line, file=sys.stderr)
        _print_skipped(errors)
    if not items:
        raise ValueError(f"no usable prompt in {cfg.prompts!r}")
    keep = kept_indices(len(items), cfg.keep_traces)
    meta = {**header(m, cfg.model, sampler, settings, cfg.units, cfg.sink_eps, cfg.capture),
            "prompts_file": os.path.abspath(cfg.prompts), "n_expected": len(items), "seed": cfg.seed, "raw": cfg.raw,
            "kept_traces": [trace_name(i) for i in sorted(keep)], "skipped": errors}
    _check_same_run(cfg.out, meta)                        # under the lock: a resumed run is the same run
    return m, items, prompts, settings, meta


def _write_prompts(cfg: CorpusConfig, m, items: list[dict], prompts: list[list[int]], settings: dict, meta: dict,
                   dist) -> None:
    """This rank's prompts not yet on disk, one fsynced line each (a kept prompt's trace beside it)."""
    from tqdm import tqdm

    rank, world = dist.rank, dist.world
    keep = kept_indices(len(items), cfg.keep_traces)
    if dist.is_main:
        rundir.write_json(os.path.join(cfg.out, "config.json"), meta)
    done = set(finished(cfg.out))
    mine = [i for i in range(len(items)) if i % world == rank]
    todo = [i for i in mine if items[i]["id"] not in done]
    bar = tqdm(total=len(mine), initial=len(mine) - len(todo), unit="prompt", desc="corpus" + (
        f" [rank 0 of {world}: 1 prompt in {world}]" if world > 1 else ""),
        disable=not cfg.progress or not dist.is_main, dynamic_ncols=True)
    os.makedirs(os.path.join(cfg.out, "traces"), exist_ok=True)
    try:
        with records.RecordWriter(os.path.join(cfg.out, f"samples.rank{rank}.jsonl")) as out:
            for i in todo:
                path = os.path.join(cfg.out, "traces", trace_name(i)) if i in keep else None
                try:
                    record = _run_prompt(m, items[i], i, prompts[i], path, settings, cfg)
                except OSError as e:              # a kept trace's write (pyarrow names no file): said with its path
                    raise e if path is None or isinstance(e, records.WriteError) else records.WriteError(path, e)
                out.write(record)
                bar.update(1)
    except records.WriteError as e:
        e.note = f"{len(finished(cfg.out))} prompts kept, re-running the same command resumes"
        raise
    finally:
        bar.close()


def kept_indices(n: int, keep_traces: int) -> set[int]:
    """The `keep_traces` of n prompts whose full traces stay, chosen evenly over the file."""
    return set(np.linspace(0, n - 1, keep_traces).round().astype(int).tolist() if keep_traces else [])


def trace_name(index: int) -> str:
    return f"{index:06d}.arrow"


def header(m, model: str, sampler: str, settings: dict, units: str, sink_eps: float, capture: CaptureOptions) -> dict:
    """The header fields every corpus file has (the model, the sampler, the rule, the bins);
    the caller adds where the prompts came from, n_expected, kept_traces and skipped."""
    return {"sinklens_corpus": FORMAT, "sinklens_version": __version__, "model": model,
            "random_init": m.source.get("random_init"),     # a seed: the random-init control (reports label it)
            "source": {k: str(v) for k, v in m.source.items()}, "family": m.family.name,
            "causal": bool(m.family.causal), "num_layers": m.num_layers, "num_heads": m.num_heads,
            "sampler": sampler, "settings": settings, "units": units, "sink_eps": sink_eps,
            "eps_values": [float(e) for e in DEFAULT_EPS_VALUES], "hist_edges": [float(e) for e in HIST_EDGES],
            "capture": asdict(capture)}


def reduce_trace(path: str, units: str, sink_eps: float) -> dict:
    """A trace's corpus parts, by units: `analyze` then `prompt_part`; a causal model's trace is
    also reduced in the baseline units (reports show both views). A corpus run gets the same parts
    without the trace (stream.StreamWriter); this is their reference."""
    a = analyze(path, AnalysisConfig(units=units, sink_eps=sink_eps))
    parts = {units: to_json(prompt_part(a))}
    if a.source.causal and units != BASELINE_UNITS:
        parts[BASELINE_UNITS] = to_json(prompt_part(analyze(path, AnalysisConfig(units=BASELINE_UNITS,
                                                                                 sink_eps=sink_eps))))
    return parts


def _run_prompt(m, item: dict, index: int, ids: list[int], path: str | None, settings: dict,
                cfg: CorpusConfig) -> dict:
    """Generate with every step folded into the prompt's parts (and its trace written to `path`
    when it is kept): one prompt's record."""
    torch.manual_seed(cfg.seed + index)                   # same seed on any rank
    w = StreamWriter(cfg.units, cfg.sink_eps, received_dtype=cfg.capture.received_dtype, keep=path)
    try:
        out = m.generate(torch.tensor([ids], dtype=torch.long), trace=w, capture=cfg.capture,
                         sampler=m.family.pick_sampler(cfg.sampler, cfg.sampler_args), **settings)
    except BaseException:
        w.abandon()                                       # a kept trace keeps its finished steps, marked truncated
        raise
    w.close()
    return {"id": item["id"], "index": index, "line": item["_line"], "prompt_tokens": len(ids),
            "steps": out.num_steps, "text": out.text[0] if out.text else None,
            "trace": os.path.join("traces", trace_name(index)) if path else None, "parts": w.parts()}


def _prepare(m, items: list[dict], errors: list[str], cfg: CorpusConfig, gen: int):
    """(usable items, their prompt ids); a duplicate id or a prompt + generation longer than the
    model's context is skipped and added to `errors` as file:line."""
    limit = getattr(m, "max_length", None)
    # no token spells more characters than the vocabulary's longest entry: a prompt longer than the
    # context times that cannot fit, and is skipped before templating and tokenising (which a line
    # of megabytes would stall on)
    chars = None if limit is None else limit * max(map(len, m.tokenizer.get_vocab()), default=1)
    kept, prompts, seen = [], [], {}
    template = not cfg.raw and getattr(m.tokenizer, "chat_template", None)
    for it in items:
        where = f"{cfg.prompts}:{it['_line']}"
        it["id"] = str(it.get("id", f"line{it['_line']}"))
        if it["id"] in seen:
            errors.append(f"{where}: duplicate id {it['id']!r} (first at {seen[it['id']]}); skipped")
            continue
        if chars is not None and len(it["prompt"]) > chars:
            errors.append(f"{where}: prompt of {len(it['prompt'])} characters exceeds the context of {cfg.model!r} "
                          f"({limit} tokens, none longer than {chars // limit} characters); skipped")
            continue
        ids = m.apply_chat_template(it["prompt"]) if template else m.tokenizer.encode(it["prompt"])
        if limit is not None and len(ids) + gen > limit:
            errors.append(f"{where}: prompt {len(ids)} + generation {gen} = {len(ids) + gen} tokens exceeds the "
                          f"context of {cfg.model!r} ({limit} tokens); skipped")
            continue
        seen[it["id"]] = where
        kept.append(it)
        prompts.append(ids)
    return kept, prompts


def _print_skipped(errors: list[str], show: int = 20) -> None:
    for e in errors[:show]:
        print(f"sinklens trace: skipped {e}", file=sys.stderr)
    if len(errors) > show:
        print(f"sinklens trace: ... and {len(errors) - show} more skipped (config.json lists all)", file=sys.stderr)
    if errors:
        too_long = sum("exceeds the context" in e for e in errors)
        print(f"sinklens trace: skipped {len(errors)} prompts ({too_long} longer than the context, "
              f"{len(errors) - too_long} unusable lines)", file=sys.stderr)


def _check_same_run(out: str, meta: dict) -> None:
    path = os.path.join(out, "config.json")
    if not os.path.exists(path) or not finished(out):   # no finished prompt: nothing to protect
        return
    try:
        with open(path) as f:
            old = json.load(f)
    except (OSError, ValueError) as e:
        raise ValueError(f"{path} cannot be read ({e}), but {out} holds results; use another --out") from None
    new = json.loads(json.dumps(meta, default=str))
    diff = [k for k in _SAME_RUN if old.get(k) != new.get(k)]
    if diff:
        raise ValueError(f"{out} holds a corpus run with other settings (differs in {diff}); use another --out to "
                         "keep both, or delete that folder")


def finished(out: str) -> dict[str, tuple[int, str, int, int]]:
    """id -> (index, shard file, start, end byte) of every complete prompt line of every rank's
    file (the first of a repeated id), read line by line: memory O(N), never the parts."""
    found: dict[str, tuple[int, str, int, int]] = {}
    for path in records.shard_files(out):
        with open(path, "rb") as f:
            start = 0
            for line in f:
                stop = start + len(line)
                if not line.endswith(b"\n"):
                    break                                 # a torn last line: not finished
                try:
                    rec = json.loads(line)
                    found.setdefault(rec["id"], (rec["index"], path, start, stop))
                except (ValueError, KeyError, TypeError):
                    pass                                  # a corrupt line (records.py skips it too)
                start = stop
    return found


def merge(out: str, meta: dict) -> str:
    """Write OUT/corpus.jsonl: the header, then every rank's prompt lines in prompt order, copied
    one at a time (memory O(N), not O(N·L·H)); temporary file + rename, so never torn."""
    lines = sorted(finished(out).values())
    header = {**meta, "n_prompts": len(lines), "complete": len(lines) == meta["n_expected"]}
    path = os.path.join(out, CORPUS_FILE)

    def fill(dst) -> None:
        dst.write((json.dumps(header, ensure_ascii=False) + "\n").encode("utf-8"))
        for _, shard, start, stop in lines:
            with open(shard, "rb") as src:
                src.seek(start)
                dst.write(src.read(stop - start))

    records.replace_file(path, fill)
    return path
