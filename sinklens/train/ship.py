"""Copy a finished run's exported folder into `sinklens/assets/<name>/` with its provenance.

The asset folder is a plain checkpoint folder (config.json, model.safetensors, tokenizer) that
`sinklens.load` reads like any other; `training/` beside the weights keeps the exact command,
the training config, the log and the curves behind the numbers in docs/training.md.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

MAX_BYTES = 25 * 2**20
ASSETS = Path(__file__).resolve().parents[1] / "assets"


def ship(run_dir: str | Path, name: str, dest_root: str | Path = ASSETS) -> Path:
    run, dest = Path(run_dir), Path(dest_root) / name
    export = run / "export"
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
    for f in ("command.txt", "log.jsonl", "curves.png"):
        shutil.copy2(run / f, prov / f)
    shutil.copy2(run / "config.json", prov / "train_config.json")
    state = json.loads((run / "ckpt" / "state.json").read_text())
    (prov / "summary.json").write_text(json.dumps({"steps": state["step"], "tokens": state["tokens"]}, indent=1))
    return dest
