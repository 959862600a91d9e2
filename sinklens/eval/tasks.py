"""The eval tasks (Table 1's two, the twins' arithmetic) behind one interface: data, prompt, verdict, defaults.

Torch-free at import, so the command line checks a task name and its data before loading a model."""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

from sinklens.eval import arith, gsm8k, humaneval
from sinklens.sandbox import SandboxConfig


@dataclass
class Task:
    name: str
    load: Callable                       # (data, limit) -> (items, errors)
    messages: Callable                   # (item, shots) -> chat messages
    text: Callable                       # (item, shots) -> plain prompt
    reference: Callable                  # (item, chat) -> reference answer text (for the log-likelihood)
    judge: Callable                      # (raw, item, sandbox) -> dict(extracted, correct, verdict, ...)
    gen_length: int | None = None        # the task's own answer length (None: each sampler's paper length), read
                                         # by the length policy, sinklens/samplers/lengths.py
    check_source: Callable = lambda data: None   # (data) -> None; raises at once when the data cannot be had
    takes_shots: bool = False            # its prompt has few-shot exemplars (--shots)
    sandboxed: bool = False              # its verdict runs code in the sandbox (--sandbox-timeout)
    data_folder: bool = False            # --data may be a folder (arith: a twin's run or exported folder)


def _gsm8k_reference(item: dict, chat: bool) -> str:
    body, final = item["answer"].rsplit("####", 1)
    body = re.sub(r"<<[^>]*>>", "", body).strip()      # drop the calculator annotations
    return f" {body} The answer is {final.strip()}."


def _gsm8k_judge(raw: str, item: dict, sandbox: SandboxConfig | None) -> dict:
    pred = gsm8k.extract_answer(raw)
    ok = gsm8k.is_correct(pred, item["reference"])
    return {"extracted": pred, "reference": item["reference"], "correct": ok,
            "verdict": "correct" if ok else ("no number" if pred is None else "wrong")}


def _humaneval_reference(item: dict, chat: bool) -> str:
    code = item["prompt"] + item["canonical_solution"]
    return f"```python\n{code}```" if chat else item["canonical_solution"]


def _humaneval_judge(raw: str, item: dict, sandbox: SandboxConfig | None) -> dict:
    code = humaneval.extract_code(raw, item)
    res = humaneval.check(item, code, sandbox)
    return {"extracted": code, "correct": res.passed, "verdict": res.status,
            "sandbox": {"status": res.status, "returncode": res.returncode, "duration": round(res.duration, 3),
                        "stderr_tail": res.stderr[-800:], "isolation": res.isolation}}


TASKS = {
    "gsm8k": Task("gsm8k", gsm8k.load, lambda it, k: gsm8k.build_messages(it["question"], k),
                  lambda it, k: gsm8k.build_text(it["question"], k), _gsm8k_reference, _gsm8k_judge,
                  check_source=gsm8k.check_source, takes_shots=True),
    "humaneval": Task("humaneval", humaneval.load, lambda it, k: humaneval.build_messages(it),
                      lambda it, k: humaneval.build_text(it), _humaneval_reference, _humaneval_judge,
                      check_source=lambda data: data is None and humaneval.package_data_path(), sandboxed=True),
}

TASKS["arith"] = Task("arith", arith.load, arith.messages, arith.text, arith.reference, arith.judge,
                      arith.gen_length(), data_folder=True)  # the tiny twins' held-out problems


def get_task(name: str) -> Task:
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}: expected one of {sorted(TASKS)}")
    return TASKS[name]
