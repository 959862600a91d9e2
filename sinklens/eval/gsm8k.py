"""GSM8K: data, chain-of-thought prompts (zero-shot or the 8 standard exemplars) and answer extraction.

Answer extraction (the rule every result uses):
1. cut the output at the first stop sequence (`STOP`: a new "Q:" the model invents, end tokens);
2. if it contains "####", the answer is the first number after the last "####";
   else the answer is the last number in the text ("The answer is 18." gives 18);
3. normalise: drop thousands commas and "$", a trailing "." ; compare numerically (18 == 18.00).
The reference answer is the number after "####" in the data set's `answer` field.
"""
from __future__ import annotations

import importlib.util
import os
import re
import socket
import urllib.parse
from decimal import Decimal, InvalidOperation

from sinklens.eval.jsonl import JsonlError, read_jsonl

# The 8 chain-of-thought exemplars of Wei et al. (2022), as lm-eval's gsm8k-cot task carries them.
EXEMPLARS = [
    ("There are 15 trees in the grove. Grove workers will plant trees in the grove today. After they are "
     "done, there will be 21 trees. How many trees did the grove workers plant today?",
     "There are 15 trees originally. Then there were 21 trees after some more were planted. So there must "
     "have been 21 - 15 = 6. The answer is 6."),
    ("If there are 3 cars in the parking lot and 2 more cars arrive, how many cars are in the parking lot?",
     "There are originally 3 cars. 2 more cars arrive. 3 + 2 = 5. The answer is 5."),
    ("Leah had 32 chocolates and her sister had 42. If they ate 35, how many pieces do they have left in total?",
     "Originally, Leah had 32 chocolates. Her sister had 42. So in total they had 32 + 42 = 74. After eating "
     "35, they had 74 - 35 = 39. The answer is 39."),
    ("Jason had 20 lollipops. He gave Denny some lollipops. Now Jason has 12 lollipops. How many lollipops "
     "did Jason give to Denny?",
     "Jason started with 20 lollipops. Then he had 12 after giving some to Denny. So he gave Denny 20 - 12 = 8. "
     "The answer is 8."),
    ("Shawn has five toys. For Christmas, he got two toys each from his mom and dad. How many toys does he "
     "have now?",
     "Shawn started with 5 toys. If he got 2 toys each from his mom and dad, then that is 4 more toys. "
     "5 + 4 = 9. The answer is 9."),
    ("There were nine computers in the server room. Five more computers were installed each day, from monday "
     "to thursday. How many computers are now in the server room?",
     "There were originally 9 computers. For each of 4 days, 5 more computers were added. So 5 * 4 = 20 "
     "computers were added. 9 + 20 is 29. The answer is 29."),
    ("Michael had 58 golf balls. On tuesday, he lost 23 golf balls. On wednesday, he lost 2 more. How many "
     "golf balls did he have at the end of wednesday?",
     "Michael started with 58 golf balls. After losing 23 on tuesday, he had 58 - 23 = 35. After losing 2 "
     "more, he had 35 - 2 = 33 golf balls. The answer is 33."),
    ("Olivia has $23. She bought five bagels for $3 each. How much money does she have left?",
     "Olivia had 23 dollars. 5 bagels for 3 dollars each will be 5 x 3 = 15 dollars. So she has 23 - 15 "
     "dollars left. 23 - 15 is 8. The answer is 8."),
]
STOP = ["\nQ:", "Q: ", "</s>", "<|im_end|>", "<|eot_id|>", "<|endoftext|>"]
ZERO_SHOT_INSTRUCTION = ("Solve the following grade-school math problem. Think step by step, then give the "
                         "final answer as a number in the form \"The answer is N.\"")
_NUMBER = re.compile(r"-?[$]?\d[\d,]*(?:\.\d+)?")


def load(data: str | None = None, limit: int | None = None) -> tuple[list[dict], list[JsonlError]]:
    """GSM8K test problems: {"id", "question", "answer", "reference"} from a local JSONL, else the hub.

    A line without a usable question / answer is skipped and returned as an error (file:line).
    """
    if data is not None:
        rows, errors = read_jsonl(data, required=("question", "answer"), check=_check_problem)
        items = [{"id": f"line{r['_line']}", "question": r["question"], "answer": r["answer"], "_line": r["_line"]}
                 for r in rows]
    else:
        check_source(None)
        import datasets

        try:
            ds = datasets.load_dataset("openai/gsm8k", "main", split="test")
        except Exception as e:       # offline, hub down, no access: say what to do instead
            raise FileNotFoundError(f"could not load openai/gsm8k from the hub ({type(e).__name__}: {e}); "
                                    "pass --data PATH to a local test.jsonl") from e
        items, errors = [], []
        for i, r in enumerate(ds):
            problem = _check_problem(r)
            if problem:
                errors.append(JsonlError("openai/gsm8k:test", i + 1, problem))
            else:
                items.append({"id": f"test{i}", "question": r["question"], "answer": r["answer"]})
    for it in items:
        it["reference"] = reference_answer(it["answer"])
    return items[:limit] if limit is not None else items, errors


HUB_DATASET = "openai/gsm8k"
NEEDS_DATA = ("pass --data PATH to a local GSM8K test.jsonl (one {\"question\", \"answer\"} object per line: "
              "grade_school_math/data/test.jsonl of github.com/openai/grade-school-math)")


def check_source(data: str | None) -> None:
    """Raise at once (no hub retries) when GSM8K cannot be had: no --data and no `datasets`, or
    no --data, the hub unreachable and no copy in the datasets cache."""
    if data is not None:
        return
    if importlib.util.find_spec("datasets") is None:
        raise FileNotFoundError(f"GSM8K without --data needs the `datasets` package (pip install 'sinklens[hub]') "
                                f"and network; or {NEEDS_DATA}")
    if not hub_reachable() and not _cached():
        raise FileNotFoundError(f"the GSM8K data set ({HUB_DATASET}) is not available offline (the hub cannot be "
                                f"reached and the datasets cache holds no copy); {NEEDS_DATA}")


def hub_reachable(timeout: float = 3.0) -> bool:
    """False when offline mode is set or the hub's host cannot be reached within `timeout` seconds."""
    if any(os.environ.get(v, "").upper() in ("1", "ON", "YES", "TRUE") for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")):
        return False
    host = urllib.parse.urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    try:
        socket.create_connection((host.hostname, host.port or 443), timeout=timeout).close()
    except OSError:
        return False
    return True


def _cached() -> bool:
    """A copy of the data set in the datasets cache (HF_DATASETS_CACHE, else HF_HOME/datasets)."""
    root = os.environ.get("HF_DATASETS_CACHE") or os.path.join(
        os.environ.get("HF_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "huggingface"), "datasets")
    return os.path.isdir(os.path.join(root, HUB_DATASET.replace("/", "___")))


def _check_problem(rec: dict) -> str | None:
    """What makes a record unusable (None when it is fine)."""
    if not isinstance(rec.get("question"), str) or not rec["question"].strip():
        return "question must be a non-empty string"
    if not isinstance(rec.get("answer"), str):
        return f"answer must be a string, got {type(rec.get('answer')).__name__}"
    if "####" not in rec["answer"]:
        return "answer has no '#### N' final answer"
    if not rec["answer"].rsplit("####", 1)[1].strip():
        return "answer has nothing after '####'"
    return None


def reference_answer(answer_field: str) -> str:
    if "####" not in answer_field:
        raise ValueError(f"GSM8K answer field has no '####' final answer: {answer_field[-80:]!r}")
    return normalise(answer_field.rsplit("####", 1)[1].strip())


def build_messages(question: str, shots: int = 8) -> list[dict]:
    """Chat messages: k exemplars as earlier user/assistant turns (lm-eval's fewshot-as-multiturn)."""
    if not 0 <= shots <= len(EXEMPLARS):
        raise ValueError(f"shots must be between 0 and {len(EXEMPLARS)}, got {shots}")
    msgs = []
    for q, a in EXEMPLARS[:shots]:
        msgs += [{"role": "user", "content": f"Q: {q}\nA:"}, {"role": "assistant", "content": a}]
    if shots == 0:
        msgs.append({"role": "user", "content": f"{ZERO_SHOT_INSTRUCTION}\n\nQ: {question}\nA:"})
    else:
        msgs.append({"role": "user", "content": f"Q: {question}\nA:"})
    return msgs


def build_text(question: str, shots: int = 8) -> str:
    """Plain-text prompt for models without a chat template (lm-eval gsm8k-cot layout)."""
    parts = [f"Q: {q}\nA: {a}\n\n" for q, a in EXEMPLARS[:shots]]
    head = "" if shots else ZERO_SHOT_INSTRUCTION + "\n\n"
    return head + "".join(parts) + f"Q: {question}\nA:"


def normalise(s: str) -> str:
    s = s.strip().replace(",", "").replace("$", "").rstrip(".")
    try:
        d = Decimal(s)
    except InvalidOperation:
        return s
    return format(d.normalize(), "f")       # 18.00 -> "18", 1,000 -> "1000", 0.50 -> "0.5"


def truncate(text: str, stop: list[str] = STOP) -> str:
    cut = min((i for i in (text.find(s) for s in stop) if i > 0), default=len(text))
    return text[:cut]


def extract_answer(text: str) -> str | None:
    """The model's final answer (normalised), or None when the output holds no number."""
    text = truncate(text)
    if "####" in text:
        m = _NUMBER.search(text.rsplit("####", 1)[1])
        return normalise(m.group()) if m else None
    nums = _NUMBER.findall(text)
    return normalise(nums[-1]) if nums else None


def is_correct(predicted: str | None, reference: str) -> bool:
    return predicted is not None and predicted == normalise(reference)
