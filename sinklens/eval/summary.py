"""Table-1 style summary of eval runs: one row per setting, models as columns.

Accuracy (GSM8K) / pass@1 (HumanEval) with its standard error, and the mean per-token
log-likelihood of the reference answer (unmasked and masked, nats); below it, for every masked
and control row, how far the masked output moved from the unmasked one (sinklens.eval.outcomes,
mean ± standard error). Markdown + CSV.

Rows: task × K × control, plus every other setting that differs between runs of one model
(read from each run's config.json, not from a fixed list), so two runs of a model with, say,
different generation lengths get two rows instead of overwriting each other. A random-key
control run (masking.control == "random") sits right below the masked row of the same K.
Settings that differ only between models (each family's own sampler defaults) stay in one row
and are listed per model in the caption, which states what was run.
"""
from __future__ import annotations

import csv
import io
import json
import os

from sinklens.eval import outcomes, records
from sinklens.eval.rundir import write_text
from sinklens.eval.stats import mean_stderr

PAPER_K_NAMES = {0: "Unmasked", 1: "K=1 (ε0)", 5: "K=5 (ε1)", 10: "K=10 (ε2)"}
METRIC = {"humaneval": "pass@1"}                      # every other task: accuracy

# config.json entries that are bookkeeping or already shown elsewhere, never a reason for a row:
# where results go, how they were computed (progress, device), how many samples (n is in the cell),
# the K list of the command (each run has its own K), the model (columns).
_NOT_A_SETTING = {"model", "source", "family", "sampler", "n_expected", "data_errors", "mask_topk",
                  "masking.mask_k", "masking.top_k",   # top_k: run folders written before it was mask_k
                  "masking.fraction", "masking.control", "config.out", "config.progress", "config.device",
                  "config.limit", "config.mask_topk", "config.model", "config.task",
                  # command-line overrides that config.json also holds resolved, under settings.*
                  "config.gen_length", "config.steps", "config.block_length"}


def find_runs(paths: list[str]) -> list[str]:
    runs = []
    for p in paths:
        if not os.path.isdir(p):
            raise FileNotFoundError(f"eval output directory not found: {p!r}")
        for root, _, files in os.walk(p):
            if "config.json" in files and records.shard_files(root) and _is_eval_run(root):
                runs.append(root)
    return sorted(runs)


def _is_eval_run(run_dir: str) -> bool:
    """config.json of an eval run (a corpus run's folder has one too, and record shards, but no verdicts)."""
    try:
        with open(os.path.join(run_dir, "config.json"), encoding="utf-8") as f:
            meta = json.load(f)
    except (OSError, ValueError):
        return False
    return isinstance(meta, dict) and {"model", "task", "mask_topk"} <= meta.keys()


def _flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = json.dumps(v, sort_keys=True) if isinstance(v, list) else v
    return out


def run_settings(meta: dict) -> dict:
    """Every setting of a run as flat `section.key` -> value (config.json of any sinklens version)."""
    flat = _flatten({k: v for k, v in meta.items()})
    resolved = {k.split(".", 1)[1] for k in flat if k.startswith(("masking.", "settings."))}
    # config.<x> that masking / settings hold resolved (ranking, threshold, ...; mask_<x> for <x>)
    dup = {k for k in flat if k.startswith("config.")
           and (k[7:] in resolved or k[7:].removeprefix("mask_") in resolved)}
    return {k: v for k, v in flat.items() if k not in _NOT_A_SETTING and k not in dup}


def summarize_run(run_dir: str) -> dict:
    with open(os.path.join(run_dir, "config.json")) as f:
        meta = json.load(f)
    masking = meta.get("masking") or {}
    recs = records.collect(run_dir)
    acc, se = mean_stderr([float(r["correct"]) for r in recs])
    row = {"model": meta["model"], "task": meta["task"], "mask_topk": meta["mask_topk"], "n": len(recs),
           "n_expected": meta.get("n_expected", len(recs)), "accuracy": acc, "stderr": se,
           "ranking": masking.get("ranking"), "arm_rule": masking.get("arm_rule"),
           "control": masking.get("control", "none"),          # runs before the control existed: none
           "run_dir": run_dir, "settings": run_settings(meta), "masking": masking,
           "sampler_settings": meta.get("settings") or {}}
    row.update(outcome_stats(run_dir, recs) if meta["mask_topk"] not in (0, "0") else {})
    ll = [r["loglik"] for r in recs if r.get("loglik")]
    if ll:
        tok = sum(x["tokens"] for x in ll)
        row["loglik_unmasked_per_token"] = sum(x["unmasked"] for x in ll) / tok
        row["loglik_masked_per_token"] = sum(x["masked"] for x in ll) / tok
    l2r = [r["loglik_l2r"] for r in recs if r.get("loglik_l2r")]
    if l2r:       # the likelihood both model types compute alike; its change with a per-sample SE
        row["ll_l2r_unmasked"], row["ll_l2r_unmasked_se"] = mean_stderr([x["unmasked"] / x["tokens"] for x in l2r])
        row["ll_l2r_masked"], row["ll_l2r_masked_se"] = mean_stderr([x["masked"] / x["tokens"] for x in l2r])
        row["ll_l2r_change"], row["ll_l2r_change_se"] = mean_stderr(
            [(x["masked"] - x["unmasked"]) / x["tokens"] for x in l2r])
    return row


def headline(run_dir: str) -> dict:
    """The numbers a machine reads of one run (eval / replicate --json): where it is, what was
    masked, accuracy ± SE over n, the log-likelihoods per token when scored, and (masked and
    control runs) the outcome readouts against the unmasked output, each with its SE; a readout
    no sample has is null."""
    r = summarize_run(run_dir)
    keys = ("run_dir", "model", "task", "mask_topk", "control", "ranking", "n", "n_expected", "accuracy", "stderr",
            "loglik_unmasked_per_token", "loglik_masked_per_token", "ll_l2r_unmasked", "ll_l2r_unmasked_se",
            "ll_l2r_change", "ll_l2r_change_se", "n_outcome",
            *(f for name in outcomes.READOUTS for f in (name, f"{name}_se")))
    nan_to_none = lambda v: None if isinstance(v, float) and v != v else v          # noqa: E731 (JSON has no NaN)
    return {k: nan_to_none(r[k]) for k in keys if k in r} | {"sinks": r["masking"].get("sinks")}


def outcome_stats(run_dir: str, recs: list[dict]) -> dict:
    """Mean and standard error of each outcome readout (sinklens.eval.outcomes) over the samples
    that have one. A record written before its unmasked sample existed gets the token readouts
    here, from the unmasked run beside it (`k0/`); its KL stays n/a (the log-probs are gone)."""
    unmasked = None
    found = []
    for r in recs:
        o = r.get("outcome")
        if o is None and "output_ids" in r:
            if unmasked is None:
                k0 = os.path.join(os.path.dirname(run_dir), "k0")
                unmasked = {u["id"]: u for u in records.collect(k0)} if os.path.isdir(k0) else {}
            u = unmasked.get(r["id"])
            o = outcomes.compare(u, r) if u is not None and "output_ids" in u else None
        if o is not None:
            found.append(o)
    row = {"n_outcome": len(found)}
    for name in outcomes.READOUTS:
        values = [float(o[name]) for o in found if o.get(name) is not None]
        row[name], row[f"{name}_se"] = mean_stderr(values)
        row[f"n_{name}"] = len(values)
    return row


def _pm(mean: float, se: float, digits: int = 2) -> str:
    if mean != mean:                                  # nan: no sample has it
        return "n/a"
    return f"{mean:.{digits}f}" + (f" ± {se:.{digits}f}" if se == se else "")


def _outcome_cell(r: dict) -> str:
    if not r.get("n_outcome"):
        return "–"
    return (f"sim {_pm(r['similarity'], r['similarity_se'])}; same {_pm(r['same_position'], r['same_position_se'])}; "
            f"flip {_pm(r['flip'], r['flip_se'])}; KL {_pm(r['kl'], r['kl_se'])}"
            + (f"; deferred {_pm(r['deferred'], r['deferred_se'])}; Δp {_pm(r['commit_prob_change'], r['commit_prob_change_se'], 3)}"
               if r.get("n_deferred") else "") + f" (n={r['n_outcome']})")


def _cell(r: dict) -> str:
    s = f"{r['accuracy']:.2f}"
    if r["stderr"] == r["stderr"]:                    # not nan
        s += f" ± {r['stderr']:.2f}"
    s += f" (n={r['n']}" + ("" if r["n"] == r["n_expected"] else f"/{r['n_expected']}") + ")"
    if "loglik_masked_per_token" in r:
        s += f"; ll {r['loglik_masked_per_token']:.3f}"
    if "ll_l2r_masked" in r:
        s += f"; l2r {_pm(r['ll_l2r_masked'], r['ll_l2r_masked_se'], 3)}"
        if r["mask_topk"] not in (0, "0"):
            s += f" (Δ {_pm(r['ll_l2r_change'], r['ll_l2r_change_se'], 3)})"
    return s


def _order(v) -> tuple:
    """Sort key for values of any type (numbers by value, the rest by text; missing last)."""
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return (0, float(v), "")
    return (1 if v is not None else 2, 0.0, str(v))


def _varying(rows: list[dict]) -> list[str]:
    """Settings with more than one value among the runs of one model (per model: a family's
    own defaults differ between models without being a second setting)."""
    keys = set()
    for model in {r["model"] for r in rows}:
        mine = [r["settings"] for r in rows if r["model"] == model]
        for k in set().union(*mine):
            if len({json.dumps(s.get(k), sort_keys=True, default=str) for s in mine}) > 1:
                keys.add(k)
    return sorted(keys - {"task"})


def _short(key: str) -> str:
    return key.split(".", 1)[1] if key.startswith(("masking.", "settings.", "config.")) else key


def _unmasked(r: dict) -> bool:
    return r["mask_topk"] in (0, "0")


def _shown(r: dict, varying: list[str]) -> list[str]:
    """The varying settings that tell this row apart: an unmasked run has no masking settings
    (its `sinks=topk` would read as one protocol's baseline when it is every protocol's)."""
    return [v for v in varying if not (_unmasked(r) and v.startswith("masking."))]


def _label(r: dict, varying: list[str]) -> str:
    k = r["mask_topk"]
    if r["control"] not in (None, "none"):
        name = f"K={k} {r['control']} keys (control)"
    else:
        name = PAPER_K_NAMES.get(k, f"K={k}")
    extra = [f"{_short(v)}={r['settings'].get(v, '–')}" for v in _shown(r, varying)]
    return ", ".join([name, *extra])


def _k_order(k) -> tuple:
    """Unmasked first, then counts ascending, then shares of the sequence ("5%") ascending."""
    if isinstance(k, str) and k.endswith("%"):
        try:
            return (1, float(k[:-1]))
        except ValueError:
            return (2, 0.0)
    return _order(k)[:2]


def _row_key(r: dict, varying: list[str]) -> tuple:
    """Sort / identity of a table row: task, the other varying settings, then K, control last; the
    unmasked run above every masking setting's rows."""
    return (r["task"], *((_order(r["settings"].get(v)) if v in _shown(r, varying) else (-1, 0.0, "")) for v in varying),
            _k_order(r["mask_topk"]), r["control"] not in (None, "none"), str(r["control"]))


def _caption(rows: list[dict], varying: list[str]) -> str:
    tasks = sorted({r["task"] for r in rows})
    metric = ", ".join(f"{METRIC.get(t, 'accuracy')} ({t})" for t in tasks)
    parts = [f"Tasks: {', '.join(tasks)}; cells: {metric} ± standard error; n = samples done (/ expected)."]
    if any("loglik_masked_per_token" in r for r in rows):
        parts.append("ll = mean log-likelihood per reference token with the sinks masked "
                     "(nats; unmasked in the CSV; a DLM's answer fully masked, an ARM's teacher-forced: not comparable "
                     "across the two).")
    if any("ll_l2r_masked" in r for r in rows):
        parts.append("l2r = log p(ref_i | prompt, ref_<i) per reference token, computed alike for DLMs and ARMs "
                     "(nats, mean ± SE over samples; Δ = masked − unmasked).")
    masked = [r["masking"] for r in rows if r["mask_topk"]]
    if masked:
        shown = {_short(v) for v in varying if v.startswith("masking.")} | {"mask_k", "top_k", "control"}
        fixed = {k: v for k, v in masked[0].items()
                 if k not in shown and all(m.get(k) == v for m in masked)}
        rule = ", ".join(f"{k}={v}" for k, v in sorted(fixed.items()) if v is not None)   # unset: not a setting
        parts.append(f"Masked runs block K keys per step; rule: {rule or 'see the rows'}."
                     + (" Control rows block K random keys instead." if any(r["control"] not in (None, "none")
                                                                           for r in rows) else ""))
    per_model = {}
    for r in rows:
        s = {k: v for k, v in r["sampler_settings"].items() if f"settings.{k}" not in varying and v is not None}
        per_model.setdefault(r["model"], s)
    samplers = "; ".join(f"{m}: " + ", ".join(f"{k}={v}" for k, v in s.items()) for m, s in sorted(per_model.items()))
    parts.append(f"Sampler settings: {samplers}.")
    if varying:
        parts.append("Rows also differ in: " + ", ".join(_short(v) for v in varying) + ".")
    return " ".join(parts)


def render(rows: list[dict]) -> tuple[str, str]:
    varying = _varying(rows)
    key = lambda r: _row_key(r, varying)              # noqa: E731
    by = {}
    for r in rows:
        by.setdefault((key(r), r["model"]), []).append(r)
    if any(len(v) > 1 for v in by.values()):          # the same setting twice (e.g. two --out folders)
        varying = varying + ["run_dir"]
        for r in rows:
            r["settings"] = dict(r["settings"], run_dir=r["run_dir"])
        by = {(key(r), r["model"]): [r] for r in rows}
    models = sorted({r["model"] for r in rows})
    md = ["| task | masking | " + " | ".join(models) + " |", "|---|---|" + "---|" * len(models)]
    for rk in sorted({key(r) for r in rows}):
        first = next(r for r in rows if key(r) == rk)
        cells = [_cell(by[(rk, mo)][0]) if (rk, mo) in by else "–" for mo in models]
        md.append(f"| {first['task']} | {_label(first, varying)} | " + " | ".join(cells) + " |")
    md += ["", _caption(rows, varying)]
    masked_keys = sorted({key(r) for r in rows if r.get("n_outcome")})
    if masked_keys:                                   # the second table: distance from the unmasked output
        md += ["", "Outcomes against the unmasked output of the same sample (no correct answer needed):", "",
               "| task | masking | " + " | ".join(models) + " |", "|---|---|" + "---|" * len(models)]
        for rk in masked_keys:
            first = next(r for r in rows if key(r) == rk)
            cells = [_outcome_cell(by[(rk, mo)][0]) if (rk, mo) in by else "–" for mo in models]
            md.append(f"| {first['task']} | {_label(first, varying)} | " + " | ".join(cells) + " |")
        md += ["", "sim = 1 − token edit distance / longer length; same = share of positions with the same token; "
               "flip = extracted answer differs; KL = mean KL(unmasked ‖ masked) of the distributions each generated "
               "position was committed from (nats/position; n/a without the unmasked run's log-probs); "
               "deferred (diffusion samplers, the paper's §5.2) = share of the unmasked run's commits the masked run "
               "makes later or never; Δp = masked − unmasked mean probability of the committed tokens at those "
               "positions; mean ± standard error over samples (sinklens.eval.outcomes)."]
    buf = io.StringIO()
    fields = ["model", "task", "mask_topk", "n", "n_expected", "accuracy", "stderr", "loglik_unmasked_per_token",
              "loglik_masked_per_token", "ll_l2r_unmasked", "ll_l2r_unmasked_se", "ll_l2r_masked",
              "ll_l2r_masked_se", "ll_l2r_change", "ll_l2r_change_se", "n_outcome",
              *(f for name in outcomes.READOUTS for f in (name, f"{name}_se")), "ranking", "arm_rule", "run_dir", "control", "row"]
    w = csv.DictWriter(buf, fieldnames=fields, extrasaction="ignore")
    w.writeheader()
    for r in sorted(rows, key=lambda r: (key(r), r["model"])):
        w.writerow(dict(r, row=_label(r, varying)))
    return "\n".join(md) + "\n", buf.getvalue()


# how the files render() writes begin: an earlier summary is replaced, any other file of these names refused
SUMMARY_STARTS = {"summary.md": "| task | masking |", "summary.csv": "model,task,mask_topk,"}


def check_summary_folder(out_dir: str) -> None:
    """Refuse `out_dir` when its summary.md / summary.csv were not written by an eval summary (the
    user's own notes there would be overwritten); called before any eval work."""
    theirs = []
    for name, start in SUMMARY_STARTS.items():
        path = os.path.join(out_dir, name)
        if os.path.isfile(path):
            with open(path, encoding="utf-8", errors="replace") as f:
                if not f.read(len(start)) == start:
                    theirs.append(name)
        elif os.path.exists(path):
            theirs.append(name)
    if theirs:
        raise ValueError(f"--out {out_dir!r} holds {', '.join(theirs)} that no sinklens eval summary wrote; the "
                         f"summary would overwrite {'them' if len(theirs) > 1 else 'it'}: give a new folder or an "
                         "earlier eval's")


def write_summary(paths: list[str], out_dir: str) -> tuple[str, str]:
    """Summarise every run found under `paths`; writes summary.md and summary.csv into out_dir."""
    check_summary_folder(out_dir)
    # a run directory without a finished sample (rejected or just started) is not a result
    rows = [summarize_run(r) for r in find_runs(paths) if records.collect(r)]
    if not rows:
        raise FileNotFoundError(f"no eval runs (config.json + samples.rank*.jsonl) under {paths}")
    md, csv_text = render(rows)
    os.makedirs(out_dir, exist_ok=True)
    write_text(os.path.join(out_dir, "summary.md"), md)
    write_text(os.path.join(out_dir, "summary.csv"), csv_text)
    return md, csv_text
