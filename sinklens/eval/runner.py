"""The Table-1 evaluation loop: resumable, one fsynced JSON line per sample, data-parallel.

Layout: `OUT/<model>/<task>/k<K>/` holds `config.json`, `samples.rank<r>.jsonl` (one file per
process) and, once every sample is done, the merged `samples.jsonl`; `OUT/summary.{md,csv}`
is the Table-1 style summary (`sinklens.eval.summary`).

Resume: the samples already on disk (any rank's file; a torn last line does not count) are
skipped, so re-running the same command completes a run without doing a sample twice.
Bad input is found before any file is written (settings, data, context length, K); bad data
lines and problems longer than the context are skipped and listed in config.json. From before
the model loads, each process holds the run directories' locks for its rank (`rundir.RunLock`),
and a failed write (disk full) keeps every complete sample and leaves no torn line.
Data-parallel: under `torchrun` / `accelerate launch` (sinklens.eval.dist: accelerate's state)
sample i goes to rank i % WORLD_SIZE; the main process merges after a barrier.
"""
from __future__ import annotations

import json
import os
import re
import sys
import time
from contextlib import ExitStack, nullcontext
from dataclasses import asdict

import torch

from sinklens.eval import outcomes, records, row_corpus, rundir
from sinklens.eval.config import EvalConfig, run_name  # EvalConfig: re-exported (it lives in config.py)
from sinklens.eval.dist import dist_state
from sinklens.eval.loglik import reference_loglik, reference_loglik_l2r
from sinklens.eval.settings import sampler_settings  # re-exported (corpus.py imports it from its home)
from sinklens.eval.summary import check_summary_folder
from sinklens.eval.tasks import get_task
from sinklens.masking.policy import SinkMaskingPolicy
from sinklens.models.options import control_label
from sinklens.samplers.steps import cut_at_end
from sinklens.samplers.registry import get_config
from sinklens.trace.commits import CommitRecorder


SMALL_MODEL = 10_000_000  # parameters: below this a CPU eval runs on one torch thread


def one_thread_for_a_small_model(m, note: bool = True) -> None:
    """A model of a few million parameters runs faster on one CPU thread: its ops are too small to
    split, and a second thread waiting for a busy core stalls every op (measured: tiny-dlm's arith
    eval 3.4x slower on 2 threads than on 1 on a loaded 2-core CPU, docs/benchmarks.md).
    OMP_NUM_THREADS, when set, decides instead (torchrun sets it to 1 per process)."""
    if "OMP_NUM_THREADS" in os.environ or torch.get_num_threads() == 1 or m.device.type != "cpu":
        return
    if sum(p.numel() for p in m.model.parameters()) < SMALL_MODEL:
        torch.set_num_threads(1)
        if note:
            print(f"note: {SMALL_MODEL // 10**6}M parameters or fewer on CPU: 1 torch thread (faster for a model this "
                  "small; set OMP_NUM_THREADS to choose)", file=sys.stderr)


def run_sampler(m, cfg: EvalConfig) -> str:
    """The sampler an eval runs: --sampler, which must be one the model's family runs, else the family's own."""
    return m.family.pick_sampler(cfg.sampler, cfg.sampler_args)


def model_slug(name: str) -> str:
    """The folder under --out that holds a model's runs: its name, made safe. `.` and `..` (a model
    folder named relative to the working directory) take the folder's own name: as a path part they
    would put the runs beside --out or above it."""
    base = os.path.basename(str(name).rstrip("/")) or str(name)
    if base in (".", ".."):
        base = os.path.basename(os.path.abspath(str(name))) or "model"
    return re.sub(r"[^A-Za-z0-9_.-]+", "__", base)


def _prompt(m, task, item, cfg: EvalConfig) -> tuple[list[int], bool]:
    has_template = m.tokenizer is not None and getattr(m.tokenizer, "chat_template", None)
    if cfg.chat == "on" and not has_template:
        raise ValueError(f"--chat on, but the tokenizer of {cfg.model!r} has no chat template")
    if cfg.chat == "on" or (cfg.chat == "auto" and has_template):
        return m.apply_chat_template(task.messages(item, cfg.shots)), True
    return m.tokenizer(task.text(item, cfg.shots))["input_ids"], False


def generate_sample(m, ids: list[int], policy: SinkMaskingPolicy, settings: dict, seed: int = 0,
                    commits=(), sampler: str | None = None, trace=None) -> tuple[str, list[int]]:
    """One generation with the family's own sampler (or `sampler`, one of its others), the masking
    policy as its hook; (the new text, the new token ids cut at the first end token). `commits`:
    further step hooks (an `outcomes.CommitLogits`, a `CommitRecorder`); `trace`: a trace path or
    writer (--attention-stats: the row's `stream.StreamWriter`), with the capture the masking hook uses."""
    torch.manual_seed(seed)
    policy.reset(seed)                     # the random control draws from its own seeded generator
    hook = capture = None
    if policy.config.active or trace is not None:   # received attention only; ARM prefix rule: every prefix row
        capture = row_corpus.eval_capture(m, policy.config.arm_rule)
    if policy.config.active:
        hook = policy
    hooks = [h for h in (hook, *commits) if h is not None]
    out = m.generate(torch.tensor([ids], dtype=torch.long), hook=hooks or None, capture=capture, sampler=sampler,
                     trace=trace, **settings)
    return out.text[0], cut_at_end(m, out.sequences[0, len(ids):].tolist())


def generate_text(m, ids: list[int], policy: SinkMaskingPolicy, settings: dict, seed: int = 0) -> str:
    """One generation (see `generate_sample`); the new text."""
    return generate_sample(m, ids, policy, settings, seed)[0]


def run_eval(cfg: EvalConfig, model=None) -> list[str]:
    """Run (or resume) every K of `cfg`; returns the run directories. `model`: an already loaded SinkModel."""
    # 1. Everything that can be wrong with the inputs is found before any file is written, so a
    #    rejected run leaves nothing behind that could block the next, correct one.
    task = get_task(cfg.task)
    items, errors = task.load(cfg.data, cfg.limit)
    check_summary_folder(cfg.out)  # its summary.md / .csv are written at the end: refused now, not after the run
    sandbox = cfg.sandbox_config()  # HumanEval without bubblewrap and no --sandbox fallback: refused before the model loads
    dist = dist_state(cfg.device)  # the launcher's processes (accelerate's state), or just this one
    with ExitStack() as held:
        # 2. Every run directory locked for this rank before the model loads: a second writer into
        #    the same --out is refused at once (a refused run's locks leave no folder behind)
        for k, control in cfg.runs():
            held.enter_context(rundir.RunLock(_run_dir(cfg, k, control), dist.rank))
        m = _model(cfg, dist, model)
        runs, items, prompts, settings, errors = _plan_runs(cfg, m, task, items, errors, dist)
        # 3. Compute and write, one row after the other.
        try:
            run_dirs = [_run_row(cfg, m, task, items, prompts, settings, sandbox, dist, *run) for run in runs]
            if dist.rank == 0:
                from sinklens.eval.summary import write_summary
                write_summary([cfg.out], cfg.out)
                if errors:
                    print(f"sinklens eval: {skip_summary(errors, len(items) + len(errors))}", file=sys.stderr)
        except records.WriteError as e:                   # disk full, file-size limit: say what is safe
            kept = sum(len(records.collect(d)) for *_, d, _ in runs)
            e.note = f"{kept} samples kept, re-running the same command resumes"
            raise
    return run_dirs


def _model(cfg: EvalConfig, dist, model=None):
    """The model of the eval (`model`, else loaded), on one CPU thread when it is small; refused
    when it cannot be evaluated."""
    from sinklens.models.loader import load

    m = model if model is not None else load(cfg.model, dtype=cfg.dtype, device=cfg.device or dist.device,
                                             random_init=cfg.random_init, mode=cfg.mode)
    if m.tokenizer is None:
        raise ValueError(f"{cfg.model!r} ships no tokenizer; the eval needs text prompts")
    one_thread_for_a_small_model(m, note=dist.rank == 0 and cfg.progress)   # not under --quiet
    if not get_config(run_sampler(m, cfg)).generates:
        raise ValueError(f"{cfg.model!r} is a {m.family.name!r} encoder: it generates no text, so there is nothing to "
                         "evaluate; trace it with `sinklens trace` instead")
    return m


def _plan_runs(cfg: EvalConfig, m, task, items: list[dict], errors: list, dist):
    """(runs, usable items, their prompts, the sampler settings, skipped lines): everything checked
    against the loaded model, nothing written yet."""
    sampler = run_sampler(m, cfg)
    settings, notes = sampler_settings(m, cfg.task, cfg.gen_length, sampler=sampler, **cfg.sampler_args)
    if dist.rank == 0:
        for line in notes:
            print(line, file=sys.stderr)
    gen = get_config(sampler).from_kwargs(**settings).length
    items, prompts, errors = _prepare(m, task, items, errors, cfg, gen)   # (ids, chat) per item
    if dist.rank == 0:
        _print_data_errors(errors)
    if not items:
        raise ValueError(f"no usable samples in {cfg.data or cfg.task!r}")
    shortest = min(len(p) for p, _ in prompts) + (gen if m.is_diffusion else 0)
    runs = [_plan(cfg, m, k, control, settings, len(items), errors, shortest) for k, control in cfg.runs()]
    return runs, items, prompts, settings, errors


def _run_row(cfg: EvalConfig, m, task, items, prompts, settings, sandbox, dist, k, control, mcfg, policy, run_dir,
             meta) -> str:
    """One row (K, control) of Table 1: this rank's samples not yet on disk, one record line each;
    the main process merges after a barrier. Returns the run directory."""
    from tqdm import tqdm

    rank, world = dist.rank, dist.world
    _check_same_run(run_dir, meta)            # again, under the lock: the folder may have changed
    if rank == 0:
        rundir.write_json(os.path.join(run_dir, "config.json"), meta)
    done = {r["id"] for r in records.collect(run_dir)}
    base = _baseline(cfg, k, control)
    mine = [i for i in range(len(items)) if i % world == rank]
    todo = [i for i in mine if items[i]["id"] not in done]
    # one bar, on the main process, labelled with its share when several processes run
    label = f"{cfg.task} K={k}" + ("" if control == "none" else f" {control} control")
    if world > 1:
        label += f" [rank 0 of {world}: 1 sample in {world}]"
    bar = tqdm(total=len(mine), initial=len(mine) - len(todo), unit="sample", desc=label,
               disable=not cfg.progress or not dist.is_main, dynamic_ncols=True)
    stats = row_corpus.for_row(cfg, m, run_dir, rank, meta, len(items))   # --attention-stats, else None
    with records.RecordWriter(os.path.join(run_dir, f"samples.rank{rank}.jsonl")) as out, stats or nullcontext():
        for i in todo:
            out.write(_run_sample(m, task, items[i], i, prompts[i], k, mcfg, policy, settings, cfg, sandbox, base,
                                  stats))
            bar.update(1)
    bar.close()
    if world == 1 or "MASTER_ADDR" in os.environ:  # hand-set shards have no group: a later run merges
        dist.barrier()
        if dist.is_main:
            records.merge(run_dir)
            if stats is not None:
                stats.merge()
    return run_dir


def _prepare(m, task, items: list[dict], errors: list, cfg: EvalConfig, gen: int):
    """Prompts of the usable items; an item that cannot be used (duplicate id, no reference
    answer, a prompt + generation longer than the model's context) is skipped and added to
    `errors`. Raises when no prompt could fit (the generation alone fills the context, or every
    problem is too long): that is a setting to change, not a bad line."""
    errors = [str(e) for e in errors]
    limit = getattr(m, "max_length", None)
    kept, prompts, seen = [], [], {}
    too_long_hint = None
    for it in items:
        where = f"{cfg.data}:{it['_line']}" if cfg.data and "_line" in it else f"sample {it['id']!r}"
        if it["id"] in seen:
            errors.append(f"{where}: duplicate id {it['id']!r} (first at {seen[it['id']]}); skipped")
            continue
        ids, chat = _prompt(m, task, it, cfg)
        ref = []
        if cfg.loglik:
            try:
                ref = m.tokenizer(task.reference(it, chat), add_special_tokens=False)["input_ids"]
            except (KeyError, TypeError, ValueError) as e:
                errors.append(f"{where}: no usable reference answer ({type(e).__name__}: {e}); skipped")
                continue
        if limit is not None and len(ids) + max(gen, len(ref)) > limit:
            what = f"generation {gen}" if gen >= len(ref) else f"reference answer {len(ref)} (log-likelihood)"
            too_long = (f"{where}: prompt {len(ids)} + {what} = {len(ids) + max(gen, len(ref))} tokens "
                        f"exceeds the context of {cfg.model!r} ({limit} tokens)")
            if gen >= limit:     # no prompt could fit: a setting to change, not a bad line
                raise ValueError(f"{too_long}; use a smaller --gen-length")
            errors.append(f"{too_long}; skipped")
            too_long_hint = ("the prompts alone fill the context: the task needs a model with a longer context"
                             if len(ids) >= limit else
                             "use a smaller --gen-length" + (" or --no-loglik" if gen < len(ref) else ""))
            continue
        seen[it["id"]] = where
        kept.append(it)
        prompts.append((ids, chat))
    if items and not kept and too_long_hint:   # every problem too long: the setting, not the data
        raise ValueError(f"no problem fits the context of {cfg.model!r} ({limit} tokens), e.g. "
                         f"{errors[-1].removesuffix('; skipped')}; {too_long_hint}")
    return kept, prompts, errors


def skip_summary(errors: list[str], total: int) -> str:
    """One line: how many problems were skipped, and why."""
    too_long = sum("exceeds the context" in e for e in errors)
    why = [f"{n} {what}" for n, what in [(too_long, "longer than the model's context"),
                                         (len(errors) - too_long, "unusable data lines")] if n]
    return (f"skipped {len(errors)} of {total} problems ({', '.join(why)}); "
            "config.json data_errors lists each with its file:line")


def _print_data_errors(errors: list[str], show: int = 20) -> None:
    """Each skipped line once, on stderr (all of them are in config.json `data_errors`)."""
    for e in errors[:show]:
        print(f"sinklens eval: skipped {e}", file=sys.stderr)
    if len(errors) > show:
        print(f"sinklens eval: ... and {len(errors) - show} more skipped (config.json data_errors lists all)",
              file=sys.stderr)


def _plan(cfg: EvalConfig, m, k, control: str, settings: dict, n_items: int, errors: list[str], shortest: int):
    """(k, control, masking config, policy, run directory, config.json contents) of one run, checked,
    nothing written."""
    mcfg = cfg.masking(k, control)
    policy = SinkMaskingPolicy(mcfg, num_layers=m.num_layers, is_diffusion=m.is_diffusion, model=m)
    policy.check_num_keys(shortest)                                      # K larger than the sequence
    run_dir = _run_dir(cfg, k, control)
    meta = {"model": control_label(cfg.model, cfg.random_init) + (f" ({cfg.mode})" if cfg.mode else ""),   # rows name the control, the mode apart
            "source": {k2: str(v) for k2, v in m.source.items()}, "family": m.family.name,
            "task": cfg.task, "mask_topk": k, "masking": mcfg.describe(m.is_diffusion),
            "sampler": run_sampler(m, cfg), "settings": settings, "n_expected": n_items,
            "config": asdict(cfg), "data_errors": errors}
    _check_same_run(run_dir, meta)                                       # resume only the same experiment
    return k, control, mcfg, policy, run_dir, meta


def _run_dir(cfg: EvalConfig, k, control: str = "none") -> str:
    control_init = "" if cfg.random_init is None else f"-random-init-{cfg.random_init}"   # never the trained run's folder
    mode = "" if cfg.mode is None else f"-{cfg.mode}"        # a dual checkpoint's modes never share a folder
    return os.path.join(cfg.out, model_slug(cfg.model) + mode + control_init, cfg.task, run_name(k, control))


# What must not change when a run is resumed (--limit may grow; progress, device, dtype may change).
_SAME_RUN_KEYS = ("model", "task", "mask_topk", "masking", "sampler", "settings")
_SAME_RUN_CONFIG = ("data", "shots", "chat", "seed", "loglik", "attention_stats", "keep_traces")


def _check_same_run(run_dir: str, meta: dict) -> None:
    path = os.path.join(run_dir, "config.json")
    if not os.path.exists(path) or not records.collect(run_dir):   # no finished sample: nothing to protect
        return
    try:
        with open(path) as f:
            old = json.load(f)
    except (OSError, ValueError) as e:
        raise ValueError(f"{path} cannot be read ({e}), but {run_dir} holds results; "
                         "use another --out, or delete that folder") from None
    new = json.loads(json.dumps(meta, default=str))
    diff = [k for k in _SAME_RUN_KEYS if old.get(k) != new.get(k)]
    diff += [f"config.{k}" for k in _SAME_RUN_CONFIG
             if old.get("config", {}).get(k) != new["config"].get(k)]
    if diff:
        raise ValueError(f"{run_dir} holds results of a different run (differs in {diff}); "
                         "use another --out to keep both, or delete that folder")


def _categorizer(m):
    """token id -> category (whitespace, punctuation, mask, special, other), as the analysis names them."""
    from sinklens.analysis.tokens import categorize
    special = {i for i in (m.eos_id, m.eot_id, m.pad_id) if i is not None}
    return lambda tid: categorize(m.tokenizer.convert_ids_to_tokens(tid) or "", tid, m.mask_id, special)


def _baseline(cfg: EvalConfig, k, control: str):
    """What a run needs for the outcome readouts (sinklens.eval.outcomes): the unmasked run keeps
    each sample's commit log-probs ("keep"; always, so a masked run added later finds them); a
    masked run compares with the unmasked run of this eval (its directory, its records by id; it
    ran first, `cfg.runs()`). None: an eval without K = 0 has no unmasked output to compare with
    (the summary compares later, once one exists)."""
    if (k, control) == (0, "none"):
        return "keep"
    if (0, "none") not in cfg.runs():
        return None
    return _run_dir(cfg, 0), {r["id"]: r for r in records.collect(_run_dir(cfg, 0))}


def _run_sample(m, task, item, index, prompt, k, mcfg, policy, settings, cfg, sandbox, base=None,
                stats=None) -> dict:
    ids, chat = prompt
    ref = base[1].get(item["id"]) if isinstance(base, tuple) else None        # the unmasked record, if done
    ref_top = outcomes.load_top(base[0], ref["index"]) if ref is not None else None
    commits = (outcomes.CommitLogits(len(ids), arm=not m.is_diffusion, ref=ref_top)
               if base == "keep" or ref_top is not None else None)
    recorder = CommitRecorder() if m.is_diffusion else None    # §5.2: when and how confidently each position was committed
    t0 = time.monotonic()
    raw, new_ids = generate_sample(m, ids, policy, settings, seed=cfg.seed + index, commits=(commits, recorder),
                                   sampler=run_sampler(m, cfg), trace=stats and stats.writer(index))  # same seed on any rank
    t_gen = time.monotonic() - t0
    if stats is not None:
        stats.add(item, index, ids, raw)             # its corpus line before the record line: resumable
    t0 = time.monotonic()
    verdict = task.judge(raw, item, sandbox)
    t_check = time.monotonic() - t0
    rec = {"id": item["id"], "index": index, "task": task.name, "model": cfg.model, "mask_topk": k,
           "prompt": m.tokenizer.decode(ids), "chat_template": chat, "raw_output": raw, "output_ids": new_ids,
           **verdict, "masked": policy.summary(_categorizer(m)) if mcfg.active else None,
           "timing": {"generate_s": round(t_gen, 3), "check_s": round(t_check, 3)}}
    if recorder is not None and recorder.rows:
        rec["commits"] = outcomes.commit_record(recorder.rows[0], len(ids))
    if base == "keep":
        outcomes.save_top(_run_dir(cfg, 0), index, commits.top())       # before the record line: resumable
    elif ref is not None and "output_ids" in ref:
        kl = outcomes.kl_to_unmasked(ref_top, commits.rows) if ref_top else None
        rec["outcome"] = outcomes.compare(ref, rec, kl)
    if cfg.loglik:
        t0 = time.monotonic()
        ref_ids = m.tokenizer(task.reference(item, chat), add_special_tokens=False)["input_ids"]
        rec["loglik"] = reference_loglik(m, ids, ref_ids, mcfg)
        if cfg.loglik_l2r:
            rec["loglik_l2r"] = reference_loglik_l2r(m, ids, ref_ids, mcfg)
        rec["timing"]["loglik_s"] = round(time.monotonic() - t0, 3)
    return rec
