"""Copy a finished run's exported folder into `sinklens/assets/<name>/` with its provenance.

The asset folder is a plain checkpoint folder (config.json, model.safetensors, tokenizer) that
`sinklens.load` reads like any other; `training/` beside the weights keeps the exact command,
the training config, the log and the curves behind the numbers in docs/training.md. No machine's
path is shipped: the run's folder is recorded relative to its parent (`runs/<run>`) and a run
started from another (`init_from`) names its teacher by the shipped twin's name (`teacher=`).
"""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

MAX_BYTES = 25 * 2**20
ASSETS = Path(__file__).resolve().parents[1] / "assets"
ABSOLUTE = re.compile(r"(?<![\w.~-])/(?:[\w.-]+/)*[\w.-]+")   # an absolute path in a text


def _portable(text: str, run: Path) -> str:
    """`text` with the run's parent folder written relative (<anywhere>/runs/x -> runs/x)."""
    parent = run.resolve().parent
    return text.replace(str(parent) + "/", parent.name + "/")


def _provenance(run: Path, teacher: str | None) -> tuple[dict, str]:
    """A run's config and command with no machine path: its folder relative to its parent, the run it
    started from as the shipped twin `teacher` names (or, inside a chain of stages, as `runs/<stage>`)."""
    config = json.loads((run / "config.json").read_text())
    config["out"] = _portable(str(run.resolve()), run)
    if config.get("init_from"):
        if teacher is None and ("/" in config["init_from"] or not (ASSETS / config["init_from"]).is_dir()):
            raise ValueError(f"{run} started from {config['init_from']}: name the shipped twin it is "
                             "(ship(..., teacher=NAME)), a shipped config never holds a machine's path")
        config["init_from"] = teacher or config["init_from"]
    command = _portable((run / "command.txt").read_text(), run).rstrip("\n") + "\n"
    if ABSOLUTE.search(command):
        raise ValueError(f"{run}/command.txt holds an absolute path ({ABSOLUTE.search(command).group()}) "
                         "outside the run's parent folder: it would not mean anything on another machine")
    return config, command


def ship(run_dir: str | Path, name: str, dest_root: str | Path = ASSETS, teacher: str | None = None,
         snapshot: bool = False, stages: tuple = ()) -> Path:
    """`teacher`: the shipped twin the run started from (its `init_from`), by name. `snapshot`: ship
    `<run>/snapshot` (train.snapshot: the latest checkpoint of a run not yet finished) instead of
    the finished run's export; the log is cut at the checkpoint's step. `stages`: the runs before
    this one when it ends a chain (each started from the one before it, the first from `teacher`),
    in order: their commands lead training/command.txt, their logs and configs go to
    training/stages/<run>/ (each naming the stage before it as `runs/<stage>`), and summary.json
    counts the steps and tokens of the whole chain; training/train_config.json, the last stage's,
    names `teacher` as where the chain started."""
    run, dest = Path(run_dir), Path(dest_root) / name
    chain = [Path(s) for s in stages]
    earlier = [(s, *_provenance(s, teacher if i == 0 else f"runs/{chain[i - 1].name}")) for i, s in enumerate(chain)]
    # the shipped config names the twin the chain started from (it must load on any machine); the
    # stage it started from directly is in command.txt and summary.json's stages
    config, command = _provenance(run, teacher)
    src = run / "snapshot" if snapshot else run       # the export, the curves (and the state: ckpt/)
    export = src / "export"
    if not (export / "model.safetensors").is_file():
        raise FileNotFoundError(f"{export} has no model.safetensors: has the run in {run} finished?")
    size = sum(f.stat().st_size for f in export.iterdir())
    if size > MAX_BYTES:
        raise ValueError(f"{export} is {size / 2**20:.1f} MB; shipped checkpoints must be <= 25 MB")
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(export, dest)
    for f in dest.iterdir():
        f.chmod(0o644)    # safetensors writes 0600; the package files must be world-readable
    prov = dest / "training"
    prov.mkdir()
    state = json.loads((src / "state.json" if snapshot else run / "ckpt" / "state.json").read_text())
    lines = (run / "log.jsonl").read_text().splitlines()
    if snapshot:     # the run went on after the checkpoint: its log is cut there
        lines = [l for l in lines if json.loads(l)["step"] <= state["step"]]
    (prov / "log.jsonl").write_text("".join(l + "\n" for l in lines))
    shutil.copy2(src / "curves.png", prov / "curves.png")
    summary = {"steps": state["step"], "tokens": state["tokens"], "schedule_steps": config.get("steps")}
    if earlier:
        totals = [json.loads((s / "ckpt" / "state.json").read_text()) for s, _, _ in earlier]
        summary["stages"] = [{"run": c["out"], "steps": t["step"], "tokens": t["tokens"]}
                             for (_, c, _), t in zip(earlier, totals)] + [
            {"run": config["out"], "steps": state["step"], "tokens": state["tokens"]}]
        summary["chain_steps"] = sum(st["steps"] for st in summary["stages"])
        summary["chain_tokens"] = sum(st["tokens"] for st in summary["stages"])
        for s, c, _ in earlier:
            (prov / "stages" / s.name).mkdir(parents=True)
            shutil.copy2(s / "log.jsonl", prov / "stages" / s.name / "log.jsonl")
            (prov / "stages" / s.name / "train_config.json").write_text(json.dumps(c, indent=1))
        command = "".join(f"# stage {i + 1} of {len(earlier) + 1}: {c['out']}\n{cmd}" for i, (_, c, cmd) in
                          enumerate(earlier)) + f"# stage {len(earlier) + 1} of {len(earlier) + 1}: {config['out']}\n{command}"
    (prov / "command.txt").write_text(command)
    (prov / "train_config.json").write_text(json.dumps(config, indent=1))
    (prov / "summary.json").write_text(json.dumps(summary, indent=1))
    return dest
