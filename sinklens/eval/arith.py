"""The held-out arithmetic word problems as an eval task (`sinklens eval --task arith`).

Same interface as GSM8K in sinklens.eval.tasks: the prompt is the bare question in the chat
template the twins were trained with (no exemplars), the verdict compares the `#### N` answer
with the value Python computed when the problem was generated.

`--data` may name another twin's training config (a run's `config.json`, or a folder holding
`config.json` or `training/train_config.json`): the held-out problems are then generated with
that twin's data settings (e.g. the long "story" problems of docs/training.md).

Without `--data` the task uses the shipped DLM twin's data settings and answer length, read from
its own `training/train_config.json`.
"""
from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

from sinklens.train.data import DataConfig, generate

ASSETS = Path(__file__).resolve().parents[1] / "assets"
DEFAULT_N = 200
SEED = 0        # the held-out problems behind docs/training.md


@lru_cache(maxsize=1)
def twin_train_config() -> dict:
    """The DLM twin's training config ({} when the twins are not shipped)."""
    conf = ASSETS / "tiny-dlm" / "training" / "train_config.json"
    return json.loads(conf.read_text()) if conf.is_file() else {}


def twin_data_config() -> DataConfig:
    data = twin_train_config().get("data")
    return DataConfig(**data) if data else DataConfig()


def gen_length() -> int:
    return int(twin_train_config().get("gen_length", 24))


def heldout_problems(n: int, seed: int = 0, split: str = "heldout"):
    """Problems never seen in the twins' training: "heldout", new number combinations in the
    training wordings; "heldout-wording", new combinations in wordings never used in training."""
    return generate(n, seed=seed, split=split, cfg=twin_data_config())


def data_config(path: str) -> DataConfig:
    """The DataConfig stored in a training config (file or folder)."""
    p = Path(path)
    if p.is_dir():   # a run folder's config.json is its training config; an exported folder's is the model's
        found = [c for c in (p / "config.json", p / "training" / "train_config.json") if c.is_file()]
        p = next((c for c in found if "data" in _json_or_empty(c)), found[0] if found else p)
    try:
        conf = json.loads(p.read_text())
        if not isinstance(conf, dict) or "data" not in conf:
            raise ValueError('it holds no "data" section')
        return DataConfig(**conf["data"])
    except (OSError, ValueError, TypeError) as e:
        raise ValueError(f"task 'arith': --data must be a twin's training config.json (or its folder); "
                         f"{path!r}: {e}") from None


def _json_or_empty(path: Path) -> dict:
    try:
        conf = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return conf if isinstance(conf, dict) else {}


def load(data: str | None = None, limit: int | None = None):
    if data is None:
        problems = heldout_problems(limit or DEFAULT_N, seed=SEED)
    else:
        problems = generate(limit or DEFAULT_N, seed=SEED, split="heldout", cfg=data_config(data))
    return [{"id": f"heldout{i}", "question": p.question, "answer": p.solution, "reference": str(p.answer)}
            for i, p in enumerate(problems)], []


def messages(item: dict, shots: int = 0) -> list[dict]:
    return [{"role": "user", "content": item["question"]}]


def text(item: dict, shots: int = 0) -> str:
    return item["question"]


def reference(item: dict, chat: bool) -> str:
    return item["answer"]


def judge(raw: str, item: dict, sandbox=None) -> dict:
    from sinklens.train.batch import parse_answer   # imports torch: here, so the task table does not

    pred = parse_answer(raw)
    ok = pred is not None and str(pred) == item["reference"]
    return {"extracted": pred, "reference": item["reference"], "correct": ok,
            "verdict": "correct" if ok else ("no answer" if pred is None else "wrong")}

