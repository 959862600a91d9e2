"""`sinklens replicate`: the paper's Table 1 (and its dynamics figures) at CPU scale, on matched twins.

1. Accuracy on held-out arithmetic problems, unmasked and with the top-K sinks masked
   (K = 1, 5, 10), under both readings of the paper's protocol (rule/spec.py `PROTOCOLS`):
   `topk` (default: the top-K keys per (layer, head) of step t − 1's attention before blocking,
   "ε lowered until K sinks pass") and `eq3` (the top-K among the ε = 3 Eq. 3 sinks), each masked
   row beside its control (as many random non-sink keys per head), with standard errors, for the
   four matched models (`twins.matched_models`): the ARM twin, the DLM twin, and tiny-dual, one set
   of weights trained both ways, in its AR mode and its block-diffusion mode: `sinklens.eval` on
   task "arith" -> `<out>/eval/<protocol>/`, one table of all in `<out>/eval/summary.md` (with the
   outcome readouts the eval records); and the persistence of the blocked keys against the
   unmasked top-1 stability -> `<out>/persistence.md`.
2. Sink dynamics: both twins traced on a held-out problem and reported (largest-sink
   movement, sink counts per layer, the tokens sinks sit on, figures) -> `<out>/dynamics/`.
3. The same dynamics aggregated over `--n-traces` held-out problems (default 50) ->
   `<out>/dynamics_over_problems.{md,json}`: how often the largest sink moves between steps
   (a sink at both steps, the old position no sink any more and the new one no sink before;
   rank swaps of standing sinks counted apart), sinks per head and step by layer, and the token
   categories sinks sit on (Table 2 analogue).
Resumable: the eval part skips samples already on disk.
"""
from __future__ import annotations

from pathlib import Path

from sinklens.eval.arith import heldout_problems
from sinklens.experiments.demo_model import slug
from sinklens.experiments.twins import demo_models_and_prompt, dlm_sampler, heldout_for, matched_models, twin_folder
from sinklens.rule.spec import BASELINE_UNITS, DEFAULT_EPS, DEFAULT_UNITS, PROTOCOLS


def dynamics_over_problems(out: str | Path, n_traces: int = 50, progress: bool = True,
                           models: list | None = None, problems: list | dict | None = None) -> dict:
    """Trace each model (default: both shipped twins) on `n_traces` held-out problems (default:
    the twins'; a dict gives each model label its own list); aggregate the sink dynamics.

    Units: Eq. 3 (the default ε) in the default units for both twins (scaled column sums), and for
    the causal ARM also relative to the uniform-attention baseline.
    Per model: sinks per head, how often the largest sink moves (rank swaps apart), track classes
    (static / moving / vanishing / transient, sinklens.analysis.dynamics), drift, Table 2 categories.
    """
    import json

    import numpy as np

    from sinklens.analysis.analyze import AnalysisConfig, analyze
    from sinklens.analysis.dynamics import classify_track, drift_summary
    from sinklens.analysis.tokens import CATEGORIES

    out = Path(out)
    if models is None:
        models, _ = demo_models_and_prompt()
    problems = heldout_problems(n_traces) if problems is None else problems
    results = []
    for dm in models:
        mine = (problems[dm.label] if isinstance(problems, dict) else problems)[:n_traces]
        paths, causal = trace_problems(dm, mine, out, progress)
        views = [DEFAULT_UNITS] if not causal else [DEFAULT_UNITS, BASELINE_UNITS]
        acc = {u: {"moved": 0, "swaps": 0, "pairs": 0, "with_sink": [], "per_layer": [],
                   "cats": dict.fromkeys(CATEGORIES, 0),
                   "classes": {}, "drift": []} for u in views}
        for path in paths:
            for u in views:
                a = analyze(str(path), AnalysisConfig(units=u))
                lp = a.largest_pos  # (T, L, H), -1 = no sink
                both = (lp[1:] >= 0) & (lp[:-1] >= 0)  # a sink at consecutive steps
                moved, swapped = a.largest_changes()
                acc[u]["moved"] += int(moved.sum())
                acc[u]["swaps"] += int(swapped.sum())
                acc[u]["pairs"] += int(both.sum())
                acc[u]["with_sink"].append(float((lp >= 0).mean()))
                acc[u]["per_layer"].append(a.sink_count.mean(axis=(0, 2)))  # (L,)
                for c, v in a.token_table.categories.items():
                    acc[u]["cats"][c] += v["count"]
                T = len(a.step_numbers)
                for tr in a.tracks:
                    kind = classify_track(tr, T)
                    acc[u]["classes"][kind] = acc[u]["classes"].get(kind, 0) + 1
                acc[u]["drift"] += a.drift
        for u, d in acc.items():
            total = sum(d["cats"].values())
            results.append({
                "model": dm.label, "units": u, "sink_eps": DEFAULT_EPS, "problems": n_traces,
                "largest_sink_moved_fraction": d["moved"] / d["pairs"] if d["pairs"] else None,
                "largest_sink_rank_swap_fraction": d["swaps"] / d["pairs"] if d["pairs"] else None,
                "consecutive_sink_pairs": d["pairs"],
                "fraction_step_layer_head_with_sink": float(np.mean(d["with_sink"])),
                "sinks_per_head_and_step_by_layer": np.mean(d["per_layer"], axis=0).round(3).tolist(),
                "sink_token_categories": {c: (n / total if total else 0.0) for c, n in d["cats"].items()},
                "sink_occurrences": total,
                "track_classes": {k: v / max(1, sum(d["classes"].values())) for k, v in sorted(d["classes"].items())},
                "tracks": sum(d["classes"].values()),
                "drift": drift_summary(d["drift"])})
    lines = [f"Sink dynamics over {n_traces} held-out problems (Eq. 3, eps = {DEFAULT_EPS:g}, in the units named per "
             "row). Of the consecutive steps where a head has a sink at both: 'moved' = its largest sink left its "
             "position for one that was no sink before (the paper's moving sink); 'rank swap' = two standing sinks "
             "exchanged the top rank (not movement).", "",
             "| model | units | (step, layer, head) with a sink | largest sink moved | rank swap | "
             "sinks / head / step by layer | " + " | ".join(CATEGORIES) + " |",
             "|---|---|---:|---:|---:|---|" + "---:|" * len(CATEGORIES)]
    for r in results:
        pairs = r["consecutive_sink_pairs"]
        moved, swap = (("n/a (no consecutive sinks)",) * 2 if r["largest_sink_moved_fraction"] is None else
                       (f"{r['largest_sink_moved_fraction']:.1%} of {pairs}",
                        f"{r['largest_sink_rank_swap_fraction']:.1%}"))
        lines.append(f"| {r['model']} | {r['units']} | {r['fraction_step_layer_head_with_sink']:.1%} | {moved} | {swap} | "
                     + " ".join(f"{x:.2f}" for x in r["sinks_per_head_and_step_by_layer"]) + " | "
                     + " | ".join(f"{r['sink_token_categories'][c]:.1%}" for c in CATEGORIES) + " |")
    lines += ["", "Tracks (a sink followed across steps in one head) and their moves:", "",
              "| model | units | tracks | static | moving | vanishing | transient | moves | leftward | "
              "mean distance (positions) |", "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        c, dr = r["track_classes"], r["drift"]
        left = f"{dr['fraction_leftward']:.1%}" if dr.get("moves") else "n/a"
        dist = f"{dr['mean_distance_positions']:+.1f}" if dr.get("moves") else "n/a"
        lines.append(f"| {r['model']} | {r['units']} | {r['tracks']} | "
                     + " | ".join(f"{c.get(k, 0.0):.1%}" for k in ("static", "moving", "vanishing", "transient"))
                     + f" | {dr.get('moves', 0)} | {left} | {dist} |")
    (out / "dynamics_over_problems.md").write_text("\n".join(lines) + "\n")
    (out / "dynamics_over_problems.json").write_text(json.dumps(results, indent=1))
    return {"dynamics_md": str(out / "dynamics_over_problems.md"), "rows": results}


def trace_problems(dm, problems: list, out: str | Path, progress: bool = True) -> tuple[list[Path], bool]:
    """Trace model `dm` on each problem -> (`<out>/traces/<label>-<k>.arrow` paths, the model is causal).
    Resumable: finished traces are kept (a trace is written under a temporary name, then renamed)."""
    import torch
    from tqdm import tqdm

    from sinklens.models.loader import load
    model = load(dm.name, **dm.load_kwargs)
    paths = []
    for k, prob in enumerate(tqdm(problems, desc=f"trace {dm.label}", disable=not progress)):
        path = Path(out) / "traces" / f"{slug(dm.label)}-{k:03d}.arrow"
        if not path.is_file():
            path.parent.mkdir(parents=True, exist_ok=True)
            ids = torch.tensor([model.apply_chat_template(prob.question)])
            tmp = path.with_suffix(".partial")
            model.generate(ids, trace=str(tmp), **dm.sampler_kwargs)
            tmp.rename(path)
        paths.append(path)
    return paths, not model.is_diffusion


def persistence_table(out: str | Path, n: int = 20, progress: bool = True, models: list | None = None) -> str:
    """Persistence of the blocked keys vs the unmasked rule (default: both twins) -> `<out>/persistence.md`."""
    import json

    from sinklens.experiments.persistence import twins_persistence
    rows = twins_persistence(n, progress=progress, models=models)
    f = lambda v: "n/a" if v is None else f"{v:.2f}"  # noqa: E731
    lines = [f"Persistence of masking on {n} held-out problems: of the keys blocked at step t − 1, the share "
             "blocked again at t (masked run), against the same rule applied to an unmasked run (for top-K, "
             "K = 1: the stability of each head's top-1 key).", "",
             "| model | rule | blocked persistence | unmasked persistence | ratio | share of keys blocked | "
             "blocked keys that are Eq. 3 sinks |", "|---|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['rule']} | {f(r['blocked'])} | {f(r['unmasked'])} | {f(r['ratio'])} | "
                     f"{f(r['blocked_share_of_keys'])} | {f(r['eq3_sink_share'])} |")
    Path(out).mkdir(parents=True, exist_ok=True)
    (Path(out) / "persistence.md").write_text("\n".join(lines) + "\n")
    (Path(out) / "persistence.json").write_text(json.dumps(rows, indent=1))
    return "\n".join(lines)


DEFAULT_N = 500   # held-out problems per Table 1 cell


def model_labels() -> list[str]:
    """The labels `replicate(models=...)` picks from: the matched models' (twins.matched_models)."""
    return [dm.label for dm in matched_models()]


def replicate(out: str | Path, n: int = DEFAULT_N, mask_topk: tuple[int | str, ...] = (0, 1, 5, 10),
              progress: bool = True, n_traces: int = 50, control: str = "random",
              protocols: tuple[str, ...] = tuple(PROTOCOLS), models: tuple[str, ...] | None = None) -> dict:
    """Table 1 on the matched models (default: all four; `models`: some of their labels) under each
    masking protocol (default: both), persistence, dynamics."""
    from sinklens.experiments.demo import run_demo
    from sinklens.eval.runner import EvalConfig, run_eval
    from sinklens.eval.summary import write_summary
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    unknown = sorted(set(protocols) - set(PROTOCOLS))
    if unknown or not protocols:
        raise ValueError(f"protocols must be a non-empty subset of {list(PROTOCOLS)}, got {list(protocols)}")
    unknown = sorted(set(models or ()) - set(model_labels()))
    if unknown or models == ():
        raise ValueError(f"models must be some of {model_labels()}, got {list(models)}")
    out = Path(out)
    models = [dm for dm in matched_models() if models is None or dm.label in models]
    dirs = []
    for i, protocol in enumerate(protocols):
        dirs.append(str(out / "eval" / protocol))
        ks = mask_topk if i == 0 else tuple(k for k in mask_topk if k not in (0, "0"))   # one unmasked run
        for dm in models:
            run_eval(EvalConfig(model=dm.name, mode=dm.load_kwargs.get("mode"), task="arith", out=dirs[-1],
                                data=str(twin_folder(dm)),   # its own held-out problems
                                mask_topk=ks, limit=n, shots=0, chat="on", dtype="float32", mask_sinks=protocol,
                                sampler_args={"block_length": dlm_sampler()["block_length"]} if dm.label == "tiny-dlm" else {},
                                loglik=False, progress=progress, mask_control=control))
    md, csv = write_summary(dirs, str(out / "eval"))
    persistence_table(out, n=min(20, n), progress=progress, models=models)
    html = run_demo(out / "dynamics", quiet=not progress, timing=False)
    dyn = dynamics_over_problems(out, n_traces, progress, models=models,
                                 problems={dm.label: heldout_for(dm, n_traces) for dm in models}) if n_traces > 0 else {}
    return {"summary_md": md, "summary_csv": csv, "report": str(html), "persistence_md": str(out / "persistence.md"),
            **dyn}
