"""A run directory's guards: one writer per rank (`RunLock`, sinklens/runlock.py: a second process
with the same rank into the same `--out` is refused in one line), and whole-file writes for its
small files.
"""
from __future__ import annotations

import json
import os

from sinklens.eval.records import WriteError, write_text  # noqa: F401  (re-exported)
from sinklens.runlock import RunDirBusy, RunLock  # noqa: F401  (re-exported: one lock for eval, corpus and train)


def recorded_model_name(name: str) -> str:
    """How a run records --model, so that the same local folder typed another way (`./m/`, `m`)
    resumes its run instead of being refused as another model; an alias or hub id as given."""
    return os.path.normpath(name) if os.path.isdir(name) else name


def write_json(path: str, obj) -> None:
    write_text(path, json.dumps(obj, indent=2, default=str) + "\n")
