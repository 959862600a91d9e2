"""Issue 13's controlled study: is robustness to sink masking a property of diffusion, of scale or
of AR initialisation? Three twins of one shape trained on the long "story" problems
(docs/training.md, "A controlled study"): a DLM from scratch (LLaDA recipe), an ARM, and a DLM
initialised from the trained ARM (Dream's recipe, `--kind dlm-shift --init-from`).

    sinklens study --run dlm=RUN --run arm=RUN --run dlm-from-arm=RUN --out DIR

1. Accuracy on held-out problems of the twins' own data settings: unmasked, top-K Eq. 3 sinks
   masked and K random non-sink keys masked (control), through `sinklens.eval` -> `<out>/eval/`.
2. Sink dynamics over `n_traces` held-out problems for each twin *and* a random-initialised
   model of the same shape and format (the control the shipped report lacked): sinks per head,
   track classes (static / moving / vanishing), drift direction, Table 2 categories ->
   `<out>/dynamics_over_problems.md`.
Everything is resumable (finished samples and traces are kept).
"""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from sinklens.experiments.model_spec import DemoModel

LOAD = {"dtype": "float32"}


def run_config(run: str | Path) -> dict:
    p = Path(run) / "config.json"
    if not p.is_file():
        raise ValueError(f"--run: {run} is not a training run folder (no config.json)")
    return json.loads(p.read_text())


def sampler_kwargs(conf: dict) -> dict:
    """Each family's sampler at the settings the twin was scored with during training."""
    from sinklens.samplers.configs import get_config

    return get_config({"dlm": "llada", "arm": "arm", "dlm-shift": "dream"}[conf["kind"]]).trained_settings(conf)


def random_control(run: str | Path, out: str | Path, seed: int = 1234) -> Path:
    """A randomly initialised model of the run's shape, exported in the run's format (with its
    tokenizer), so the dynamics of trained and untrained weights are read by the same code."""
    from transformers import AutoTokenizer

    from sinklens.train.model import build_model
    from sinklens.train.train import TrainConfig, export
    folder = Path(out)
    if (folder / "config.json").is_file():
        return folder
    cfg = TrainConfig.from_dict(run_config(run))
    tok = AutoTokenizer.from_pretrained(str(Path(run) / "tokenizer"))
    cfg = replace(cfg, model=replace(cfg.model, vocab_size=len(tok)))
    model = build_model(cfg.model, diffusion=cfg.diffusion, seed=seed)
    export(model, tok, cfg, folder)
    return folder


def study(runs: dict[str, str], out: str | Path, n: int = 50, n_traces: int = 20,
          mask_topk: tuple = (0, 1, 5, 10), control: str = "random", progress: bool = True) -> dict:
    """Accuracy with controls through `sinklens.eval` (each family's Table 1 sampler settings,
    SPEC §6), then the dynamics of every twin beside its random-init control (the samplers the
    twins were scored with in training, `sampler_kwargs`)."""
    from sinklens.models.loader import load
    from sinklens.eval.runner import EvalConfig, run_eval
    from sinklens.eval.summary import write_summary
    from sinklens.experiments.replicate import dynamics_over_problems
    from sinklens.train.data import generate
    from sinklens.eval.arith import data_config
    out = Path(out)
    confs = {label: run_config(r) for label, r in runs.items()}
    for label, run in runs.items():
        c = confs[label]
        if not (Path(run) / "export" / "config.json").is_file():
            raise ValueError(f"--run {label}={run}: training has not finished (no export/)")
        s = sampler_kwargs(c)
        model = load(str(Path(run) / "export"), **LOAD)
        run_eval(EvalConfig(model=label, task="arith", data=str(Path(run) / "config.json"),
                            out=str(out / "eval"),
                            mask_topk=mask_topk, limit=n, shots=0, chat="on", gen_length=c["gen_length"],
                            sampler_args={k: s[k] for k in ("steps", "block_length") if k in s}, dtype="float32",
                            loglik=False, progress=progress, mask_control=control), model=model)
    md, csv = write_summary([str(out / "eval")], str(out / "eval"))
    models = []
    for label, run in runs.items():
        s = sampler_kwargs(confs[label])
        models.append(DemoModel(str(Path(run) / "export"), label, s, dict(LOAD)))
        ctrl = random_control(run, out / "controls" / label)
        models.append(DemoModel(str(ctrl), f"{label} (random init)", s, dict(LOAD)))
    first = next(iter(runs.values()))
    problems = generate(n_traces, seed=0, split="heldout", cfg=data_config(first))
    dyn = dynamics_over_problems(out, n_traces, progress, models=models, problems=problems)
    return {"summary_md": md, "summary_csv": csv, **dyn}
