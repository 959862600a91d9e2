"""The held-out arithmetic word problems as an eval task (`sinklens eval --task arith`).

Same interface as GSM8K in sinklens.eval.tasks: the prompt is the bare question in the chat
template the twins were trained with (no exemplars), the verdict compares the `#### N` answer
with the value Python computed when the problem was generated.
"""
from __future__ import annotations

from sinklens.train.batch import parse_answer
from sinklens.train.demo_defaults import gen_length, heldout_problems

DEFAULT_N = 200
SEED = 0        # the held-out problems behind docs/training.md


def load(data: str | None = None, limit: int | None = None):
    if data is not None:
        raise ValueError("task 'arith' generates its problems; --data is not used (omit it)")
    problems = heldout_problems(limit or DEFAULT_N, seed=SEED)
    return [{"id": f"heldout{i}", "question": p.question, "answer": p.solution, "reference": str(p.answer)}
            for i, p in enumerate(problems)], []


def messages(item: dict, shots: int = 0) -> list[dict]:
    return [{"role": "user", "content": item["question"]}]


def text(item: dict, shots: int = 0) -> str:
    return item["question"]


def reference(item: dict, chat: bool) -> str:
    return item["answer"]


def judge(raw: str, item: dict, sandbox=None) -> dict:
    pred = parse_answer(raw)
    ok = pred is not None and str(pred) == item["reference"]
    return {"extracted": pred, "reference": item["reference"], "correct": ok,
            "verdict": "correct" if ok else ("no answer" if pred is None else "wrong")}


def gen_lengths() -> dict:
    """Per sampler: the answer region the twins were trained with."""
    return {"llada": gen_length(), "dream": gen_length(), "arm": gen_length()}
