"""Table-1 style summary of eval runs: tasks × mask K as rows, models as columns.

Accuracy (GSM8K) / pass@1 (HumanEval) with its standard error, and the mean per-token
log-likelihood of the reference answer (unmasked and masked, nats). Markdown + CSV.
"""
from __future__ import annotations

import csv
import io
import json
import os

from sinklens.eval import records
from sinklens.eval.stats import mean_stderr

PAPER_K_NAMES = {0: "Unmasked", 1: "K=1 (ε0)", 5: "K=5 (ε1)", 10: "K=10 (ε2)"}


def find_runs(paths: list[str]) -> list[str]:
    runs = []
    for p in paths:
        if not os.path.isdir(p):
            raise FileNotFoundError(f"eval output directory not found: {p!r}")
        for root, _, files in os.walk(p):
            if "config.json" in files and records.shard_files(root):
                runs.append(root)
    return sorted(runs)


def summarize_run(run_dir: str) -> dict:
    with open(os.path.join(run_dir, "config.json")) as f:
        meta = json.load(f)
    recs = records.collect(run_dir)
    acc, se = mean_stderr([float(r["correct"]) for r in recs])
    row = {"model": meta["model"], "task": meta["task"], "mask_topk": meta["mask_topk"], "n": len(recs),
           "n_expected": meta["n_expected"], "accuracy": acc, "stderr": se,
           "ranking": meta["masking"].get("ranking"), "arm_rule": meta["masking"].get("arm_rule"),
           "run_dir": run_dir}
    ll = [r["loglik"] for r in recs if r.get("loglik")]
    if ll:
        tok = sum(x["tokens"] for x in ll)
        row["loglik_unmasked_per_token"] = sum(x["unmasked"] for x in ll) / tok
        row["loglik_masked_per_token"] = sum(x["masked"] for x in ll) / tok
    return row


def _cell(r: dict) -> str:
    s = f"{r['accuracy']:.2f}"
    if r["stderr"] == r["stderr"]:                    # not nan
        s += f" ± {r['stderr']:.2f}"
    s += f" (n={r['n']}" + ("" if r["n"] == r["n_expected"] else f"/{r['n_expected']}") + ")"
    if "loglik_masked_per_token" in r:
        s += f"; ll {r['loglik_masked_per_token']:.3f}"
    return s


def render(rows: list[dict]) -> tuple[str, str]:
    models = sorted({r["model"] for r in rows})
    keys = sorted({(r["task"], r["mask_topk"]) for r in rows})
    by = {(r["task"], r["mask_topk"], r["model"]): r for r in rows}
    md = ["| task | masking | " + " | ".join(models) + " |", "|---|---|" + "---|" * len(models)]
    for task, k in keys:
        cells = [_cell(by[(task, k, mo)]) if (task, k, mo) in by else "–" for mo in models]
        md.append(f"| {task} | {PAPER_K_NAMES.get(k, f'K={k}')} | " + " | ".join(cells) + " |")
    md.append("")
    md.append("Accuracy (GSM8K) / pass@1 (HumanEval) ± standard error; n = samples done (/ expected); "
              "ll = mean log-likelihood per reference token with the sinks masked (nats; unmasked in the CSV). "
              "K = sinks blocked per (layer, head), ranked by the previous step's column sums.")
    buf = io.StringIO()
    fields = ["model", "task", "mask_topk", "n", "n_expected", "accuracy", "stderr", "loglik_unmasked_per_token",
              "loglik_masked_per_token", "ranking", "arm_rule", "run_dir"]
    w = csv.DictWriter(buf, fieldnames=fields, extrasaction="ignore")
    w.writeheader()
    for r in sorted(rows, key=lambda r: (r["task"], r["mask_topk"], r["model"])):
        w.writerow(r)
    return "\n".join(md) + "\n", buf.getvalue()


def write_summary(paths: list[str], out_dir: str) -> tuple[str, str]:
    """Summarise every run found under `paths`; writes summary.md and summary.csv into out_dir."""
    rows = [summarize_run(r) for r in find_runs(paths)]
    if not rows:
        raise FileNotFoundError(f"no eval runs (config.json + samples.rank*.jsonl) under {paths}")
    md, csv_text = render(rows)
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "summary.md"), "w") as f:
        f.write(md)
    with open(os.path.join(out_dir, "summary.csv"), "w") as f:
        f.write(csv_text)
    return md, csv_text
