"""The controlled study: is robustness to sink masking a property of diffusion, of scale or
of AR initialisation? Twins of one shape trained on the long "story" problems
(docs/training.md, "A controlled study"): a DLM from scratch (LLaDA recipe), an ARM, a DLM
initialised from the trained ARM (Dream's recipe, `--kind dlm-shift --init-from`), and one set of
weights trained from the ARM with both a next-token and a block-diffusion loss (`--kind dual`),
studied in both its modes (a row each: its AR sampler, SDAR's block-diffusion sampler).

    sinklens study --run dlm=RUN --run arm=RUN --run dlm-from-arm=RUN --out DIR
    sinklens replicate --study          # the same on the shipped story twins (SHIPPED)

A twin is a finished training run folder (`export/` + `config.json`) or a shipped twin (an alias
such as `story-arm-4l`, or any exported folder with `training/train_config.json`).

1. Accuracy on held-out problems of the twins' own data settings: unmasked, top-K Eq. 3 sinks
   masked and K random non-sink keys masked (control), through `sinklens.eval` -> `<out>/eval/`,
   each twin with the sampler settings it was scored with in training (greedy; `sampler_kwargs`).
   `workers` processes split the samples (hand-set shards, merged at the end).
2. `<out>/study.md`: exact accuracy, the share of right equations (a graded score), the reference
   answer's log-likelihood (a probe that reads even where answers are wrong) and the share of the
   keys the K blocked keys are (K / S, per head and step, measured); `<out>/study.png`, the figure.
3. Sink dynamics over `n_traces` held-out problems for each twin *and* its random-init control
   (`load(twin, random_init=CONTROL_SEED)`: the same shape and format, every weight re-initialised
   by the model class's own init; sinklens/models/control.py): sinks per head,
   track classes (static / moving / vanishing), drift direction, Table 2 categories ->
   `<out>/dynamics_over_problems.md`.
Everything is resumable (finished samples and traces are kept).
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from sinklens.experiments.demo_model import DemoModel

LOAD = {"dtype": "float32"}
CONTROL_SEED = 1234   # the random-init control of each twin: load(twin, random_init=CONTROL_SEED)
STUDY_N, STUDY_TRACES = 14, 4   # `replicate --study` defaults (14 min on 2 idle cores before the l2r likelihood)
# The shipped story twins (sinklens/assets), label -> alias; those not shipped are skipped.
# "-9" / "-30": the largest operand of the twin's problems (docs/training.md).
SHIPPED = {"arm-30": "story-arm-4l", "arm-9": "story9-arm-4l", "dlm-from-arm-9": "story9-dlmarm-4l",
           "dlm-9": "story9-dlm-4l", "dual-9": "story9-dual-4l"}


def twin_files(twin: str | Path) -> tuple[Path, dict]:
    """(model folder, training config) of a finished run folder or a shipped twin."""
    from sinklens.models.loader import ALIASES

    folder = ALIASES[str(twin)]().folder if str(twin) in ALIASES else Path(twin)
    for model, conf in ((folder / "export", folder / "config.json"),            # a training run
                        (folder, folder / "training" / "train_config.json")):    # an exported twin
        if (model / "config.json").is_file() and conf.is_file():
            return model, json.loads(conf.read_text())
    if (folder / "config.json").is_file() and not (folder / "export").exists() and (folder / "ckpt").is_dir():
        raise ValueError(f"--run {twin}: training has not finished (no export/)")
    raise ValueError(f"--run {twin}: expected a training run folder (export/ + config.json) or a shipped twin "
                     "(an alias or an exported folder with training/train_config.json)")


def sampler_kwargs(conf: dict, mode: str | None = None) -> dict:
    """Each family's sampler at the settings the twin was scored with during training (the length
    policy's); a dual twin's `mode` picks its AR sampler ("ar") or its block-diffusion one (default)."""
    from sinklens.samplers import lengths
    from sinklens.samplers.registry import get_config

    kind = "arm" if conf["kind"] == "dual" and mode == "ar" else conf["kind"]
    cls = get_config({"dlm": "llada", "arm": "arm", "dlm-shift": "dream", "dual": "sdar"}[kind])
    return lengths.settings(cls, lengths.ModelFacts(train=conf)).values


def modes(label: str, conf: dict) -> list[tuple[str, str | None]]:
    """(row label, load mode) per way the twin decodes: a dual twin (one set of weights trained both
    ways) gives two rows, "<label> (ar)" and "<label> (diffusion)"; any other twin one, its label."""
    if conf["kind"] == "dual":
        return [(f"{label} (ar)", "ar"), (f"{label} (diffusion)", "diffusion")]
    return [(label, None)]


def _load_kwargs(mode: str | None) -> dict:
    return {**LOAD, **({"mode": mode} if mode else {})}


def _eval_configs(twins: dict[str, tuple[Path, dict]], out: Path, n: int, mask_topk: tuple, control: str,
                  progress: bool) -> list[tuple[str, str | None, dict]]:
    """(model folder, load mode, EvalConfig keywords) per row: the twin's held-out problems, its
    training-time sampler (a dual twin: a row per mode)."""
    jobs = []
    for twin, (folder, conf) in twins.items():
        data = out / "configs" / f"{twin.replace(' ', '_')}.json"   # the twin's data settings, for task arith
        data.parent.mkdir(parents=True, exist_ok=True)
        data.write_text(json.dumps(conf))
        for label, mode in modes(twin, conf):
            s = sampler_kwargs(conf, mode)
            jobs.append((str(folder), mode, dict(
                model=label, task="arith", data=str(data), out=str(out / "eval"), mask_topk=mask_topk, limit=n,
                shots=0, chat="on", gen_length=conf["gen_length"],
                sampler_args={k: v for k, v in s.items() if k not in ("gen_length", "max_new_tokens")},
                dtype="float32", loglik=True, loglik_l2r=True, progress=progress, mask_control=control)))
    return jobs


def _run_shard(jobs: list[tuple[str, str | None, dict]], rank: int, world: int) -> None:
    """One worker process: every `world`-th sample of each twin's eval (eval's hand-set shards)."""
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world))
    os.environ.pop("MASTER_ADDR", None)
    import torch

    from sinklens.eval.runner import EvalConfig, run_eval
    from sinklens.models.loader import load
    torch.set_num_threads(1)
    for folder, mode, kw in jobs:
        run_eval(EvalConfig(**kw), model=load(folder, **_load_kwargs(mode)))


def _trace_shard(models: list, problems: dict, n_traces: int, out: Path, rank: int, world: int) -> None:
    """One worker process: the traces of every `world`-th model."""
    import torch

    from sinklens.experiments.replicate import trace_problems
    torch.set_num_threads(1)
    for dm in models[rank::world]:
        trace_problems(dm, problems[dm.label][:n_traces], out, progress=False)


def _in_workers(fn, workers: int, *args) -> None:
    """fn(*args, rank, workers) in `workers` fresh processes (spawned: no state shared with this one)."""
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn")) as pool:
        for f in [pool.submit(fn, *args, r, workers) for r in range(workers)]:
            f.result()


def run_evals(jobs: list[tuple[str, dict]], workers: int = 1) -> None:
    """Every twin's eval; with `workers` > 1 the samples are split over that many processes (one
    CPU thread each), then merged by a last pass in this process, which finds every sample done."""
    if workers > 1:
        _in_workers(_run_shard, workers, jobs)
    _run_shard(jobs, 0, 1)


def run_stats(eval_out: Path) -> dict[tuple[str, str], dict]:
    """(model, run name) -> the measured K / S (mean share of the keys blocked per head and step)
    and the share of the written equations that are right (`equations_right`), from the samples."""
    from sinklens.eval import records
    from sinklens.train.story import equations_right

    stats = {}
    for cfg in sorted(eval_out.glob("*/arith/*/config.json")):
        rows = records.collect(str(cfg.parent))
        shares = [r["masked"]["blocked_share_of_keys"] for r in rows
                  if r.get("masked") and r["masked"].get("blocked_share_of_keys") is not None]
        right = written = 0
        for r in rows:
            ok, n = equations_right(r["raw_output"])
            right, written = right + ok, written + n
        model = json.loads(cfg.read_text(encoding="utf-8")).get("model", cfg.parent.parts[-3])  # the label, as summary.csv
        stats[(model, cfg.parent.name)] = {
            "key_share": sum(shares) / len(shares) if shares else None,
            "equations": right / written if written else None, "equations_written": written}
    return stats


def study_table(out: Path) -> str:
    """`<out>/study.md` + `<out>/study.png`: per twin, accuracy with the top-K sinks blocked beside
    the random-key control, the share of right equations (graded), and the measured K / S; from
    the eval's summary.csv and samples."""
    import csv

    from sinklens.eval.config import run_name
    rows = list(csv.DictReader((out / "eval" / "summary.csv").read_text(encoding="utf-8").splitlines()))
    stats = run_stats(out / "eval")
    models = list(dict.fromkeys(r["model"] for r in rows))
    ks = sorted({int(r["mask_topk"]) for r in rows if str(r["mask_topk"]).isdigit() and int(r["mask_topk"]) > 0})
    cell = {(r["model"], int(r["mask_topk"]) if str(r["mask_topk"]).isdigit() else r["mask_topk"], r["control"]): r
            for r in rows}
    runs = [(0, "none")] + [(k, c) for k in ks for c in ("none", "random")]
    head = ["twin", "unmasked"] + [f"K={k} {'sinks' if c == 'none' else 'random'}" for k, c in runs[1:]]

    def acc(r):
        if r is None:
            return "–"
        n = f"n={r['n']}" + ("" if r["n"] == r["n_expected"] else f"/{r['n_expected']}")
        return f"{float(r['accuracy']):.2f} ± {float(r['stderr']):.2f} ({n})"

    def eq(m, k, c):
        st = stats.get((m, run_name(k, c)))
        return "–" if st is None or st["equations"] is None else f"{st['equations']:.2f} ({st['equations_written']})"

    def table(fmt_cell):
        lines = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
        for m in models:
            lines.append("| " + " | ".join([m] + [fmt_cell(m, k, c) for k, c in runs]) + " |")
        return "\n".join(lines)
    def ll(m, k, c):     # the reference answer's log-likelihood per token: unmasked, then the change
        r = cell.get((m, k, c))
        if r is None or not r.get("loglik_masked_per_token"):
            return "–"
        un, ma = float(r["loglik_unmasked_per_token"]), float(r["loglik_masked_per_token"])
        return f"{un:.3f}" if k == 0 else f"{ma - un:+.3f}"
    def pm(r, name, digits=2):
        if r is None or not r.get(name) or r[name] == "nan":
            return "–"
        se = r.get(f"{name}_se")
        return f"{float(r[name]):.{digits}f}" + (f" ± {float(se):.{digits}f}" if se and se != "nan" else "")

    def outcome(m, k, c):   # distance of the masked output from the unmasked one: no correct answer needed
        r = cell.get((m, k, c))
        if k == 0:
            return "1 / 0 / 0"
        if r is None or not r.get("n_outcome") or r["n_outcome"] == "0":
            return "–"
        return f"{pm(r, 'similarity')} / {pm(r, 'flip')} / {pm(r, 'kl')}"

    def l2r(m, k, c):       # the likelihood both model types compute alike: unmasked, then the change
        r = cell.get((m, k, c))
        return pm(r, "ll_l2r_unmasked", 3) if k == 0 else pm(r, "ll_l2r_change", 3)
    share = ["| twin | " + " | ".join(f"K={k}" for k in ks) + " |", "|---" * (len(ks) + 1) + "|"]
    for m in models:
        share.append(f"| {m} | " + " | ".join(
            f"{stats[(m, run_name(k, 'none'))]['key_share']:.1%}"
            if stats.get((m, run_name(k, "none")), {}).get("key_share") is not None
            else "–" for k in ks) + " |")
    text = ("Held-out story problems; top-K Eq. 3 sinks per head blocked at every step, or K random non-sink "
            "keys per head instead (control).\n\nExact answer accuracy (± standard error):\n\n"
            + table(lambda m, k, c: acc(cell.get((m, k, c)))) +
            "\n\nEquations right (share of the written \"a ± b = c\" steps and checks that are correct; "
            "equations written in brackets), a graded score:\n\n" + table(eq) +
            "\n\nLog-likelihood of the reference answer per token (nats; sinklens.eval.loglik: teacher-forced for the "
            "ARMs, the answer fully masked for the DLMs, so the ARM and DLM columns are on different scales and "
            "cannot be ranked against each other): unmasked, then masked minus unmasked. A probe of one or two "
            "forwards, not a generation, so it reads even where the answers are wrong:\n\n" + table(ll) +
            "\n\nOutput against the unmasked output of the same problem (sinklens.eval.outcomes; reads without a "
            "right answer): token similarity (1 − edit distance / length) / answer-flip rate / KL of the commit "
            "distributions (nats per position), each mean ± standard error:\n\n" + table(outcome) +
            "\n\nLog-likelihood of the reference answer left to right, log p(ref_i | prompt, ref_<i) per token, computed "
            "the same way for DLMs and ARMs (sinklens.eval.loglik, --loglik-l2r): unmasked, then masked minus unmasked, "
            "mean ± standard error over problems. The one likelihood of this page that can be compared across model "
            "types:\n\n" + table(l2r) +
            "\n\nK / S, the measured share of the keys blocked per head and step (top-K sinks):\n\n"
            + "\n".join(share) + "\n")
    (out / "study.md").write_text(text)
    _figure(out / "study.png", models, ks, cell)
    return text


def _figure(path: Path, models: list[str], ks: list[int], cell: dict) -> None:
    """Per twin (columns): exact accuracy (top row) and the change of the reference answer's
    log-likelihood per token (bottom row) against K, top-K sinks blocked beside K random keys."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, len(models), figsize=(3.2 * len(models), 5.6), sharey="row", squeeze=False)
    for j, m in enumerate(models):
        for control, style in (("none", "o-"), ("random", "s--")):
            found = [(k, cell.get((m, k, "none" if k == 0 else control))) for k in [0] + ks]
            found = [(k, r) for k, r in found if r is not None]
            label = "top-K sinks blocked" if control == "none" else "K random keys blocked"
            axes[0][j].errorbar([k for k, _ in found], [float(r["accuracy"]) for _, r in found],
                                yerr=[float(r["stderr"]) for _, r in found], fmt=style, capsize=3, label=label)
            ll = [(k, float(r["loglik_masked_per_token"]) - float(r["loglik_unmasked_per_token"]))
                  for k, r in found if r.get("loglik_masked_per_token")]
            axes[1][j].plot([k for k, _ in ll], [v for _, v in ll], style, label=label)
        axes[0][j].set_title(m, fontsize=9)
        axes[1][j].set_xlabel("K (keys blocked per head)")
        for ax in axes[:, j]:
            ax.set_xticks([0] + ks)
    axes[0][0].set_ylabel("held-out exact accuracy")
    axes[0][0].set_ylim(-0.05, 1.05)
    axes[1][0].set_ylabel("Δ log-likelihood / token (nats)")
    axes[0][0].legend(fontsize=7, loc="center right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def study(runs: dict[str, str], out: str | Path, n: int = 50, n_traces: int = 20,
          mask_topk: tuple = (0, 1, 5, 10), control: str = "random", progress: bool = True,
          workers: int = 1) -> dict:
    """Accuracy with controls through `sinklens.eval`, then the dynamics of every twin beside its
    random-init control (each twin with the sampler settings it was scored with in training)."""
    from sinklens.eval.summary import write_summary
    from sinklens.experiments.replicate import dynamics_over_problems
    from sinklens.train.data import DataConfig, generate
    out = Path(out)
    for label in runs:   # a label names files under out (configs/<label>.json, traces/<label>-k.arrow)
        if label in ("", ".", "..") or "/" in label or "\\" in label:
            raise ValueError(f"--run {label}=...: a label names files under --out; expected a plain name "
                             "without '/' or '\\' (e.g. arm, dlm-9)")
    twins = {label: twin_files(r) for label, r in runs.items()}
    run_evals(_eval_configs(twins, out, n, mask_topk, control, progress), workers)
    md, csv = write_summary([str(out / "eval")], str(out / "eval"))
    study_table(out)
    models, problems = [], {}
    for twin, (folder, conf) in twins.items():
        mine = generate(n_traces, seed=0, split="heldout", cfg=DataConfig(**conf["data"]))  # the twin's own data
        for label, mode in modes(twin, conf):
            s, load = sampler_kwargs(conf, mode), _load_kwargs(mode)
            for lab, kw in ((label, load), (f"{label} (random init)", {**load, "random_init": CONTROL_SEED})):
                models.append(DemoModel(str(folder), lab, s, kw))
                problems[lab] = mine
    dyn = {}
    if n_traces > 0:
        if workers > 1:   # the traces in worker processes, a model each in turn; then read here
            _in_workers(_trace_shard, workers, models, problems, n_traces, out)
        dyn = dynamics_over_problems(out, n_traces, progress, models=models, problems=problems)
    return {"summary_md": md, "summary_csv": csv, "study_md": str(out / "study.md"), **dyn}


def shipped_twins() -> dict[str, str]:
    """The shipped story twins, label -> alias (`SHIPPED`, those present)."""
    from sinklens.models.loader import ALIASES

    return {label: alias for label, alias in SHIPPED.items() if alias in ALIASES}
