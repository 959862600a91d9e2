"""Synthetic GSM8K-style arithmetic word problems with worked solutions and a `#### N` answer.

    Q: "Mia has 23 pens. She gets 15 more. She gives away 9. How many pens now?"
    A: "23+15=38. 38-9=29. #### 29"

Why synthetic: no GSM8K train split is available offline, and a CPU-sized model can only learn
a task whose difficulty we control. Knobs: operand range, number of operations, which
operations. Prompts and answers are kept short so few tokens are wasted (a CPU-sized budget).

Train / held-out split: every problem has a *combination* key (its numbers and operations).
A fixed fraction of all combinations is reserved for held-out; the train sampler rejects them,
so held-out problems never appear in training with the same numbers, whatever the wording.
"""
from __future__ import annotations

import hashlib
import random
from dataclasses import asdict, dataclass

from sinklens.params import check_fields, param

NAMES = ["Tom", "Mia", "Sam", "Ana", "Ben", "Eva", "Leo", "Zoe", "Max", "Ivy", "Dan", "Amy"]
# (singular pronoun, object) pairs are decided per problem; pronoun follows the name.
PRONOUN = {"Tom": "He", "Sam": "He", "Ben": "He", "Leo": "He", "Max": "He", "Dan": "He",
           "Mia": "She", "Ana": "She", "Eva": "She", "Zoe": "She", "Ivy": "She", "Amy": "She"}
OBJECTS = ["apples", "pens", "cards", "coins", "books", "eggs", "cups", "toys", "rocks", "shells"]
# Phrases for each operation; {n} is the operand.
PHRASES = {
    "+": ["{p} gets {n} more.", "{p} buys {n} more.", "{p} finds {n} more."],
    "-": ["{p} gives away {n}.", "{p} loses {n}.", "{p} sells {n}."],
}


@dataclass(frozen=True)
class DataConfig:
    """Difficulty knobs of the generator (each a `sinklens train` flag)."""
    max_operand: int = param(50, int, "operands drawn from [1, N]", min=1)
    min_ops: int = param(1, int, "fewest operations per problem", min=1)
    max_ops: int = param(2, int, "most operations per problem", min=1)
    ops: str = param("+-", str, "allowed operations, a subset of +-, e.g. + or +-")
    max_value: int = param(99, int, "every intermediate result stays in [0, N]", min=1)
    heldout_fraction: float = param(0.1, float, "share of operand combinations held out", gt=0, lt=1)
    split_seed: int = param(0, int, "decides which combinations are held out")
    style: str = param("short", str, "short: one sentence per event, bare sums; story: the paper's regime, "
                       "prompts >= 48 tokens, worked answers >= 128 (story.py)", choices=("short", "story"))

    def __post_init__(self):
        check_fields(self)
        if not self.min_ops <= self.max_ops:
            raise ValueError(f"need 1 <= min_ops <= max_ops, got {self.min_ops}, {self.max_ops}")
        if not self.ops or set(self.ops) - set(PHRASES):
            raise ValueError(f"ops must be a non-empty subset of {''.join(PHRASES)!r}, got {self.ops!r}")
        if self.max_value < self.max_operand:
            raise ValueError(f"max_value ({self.max_value}) must be >= max_operand ({self.max_operand})")


@dataclass(frozen=True)
class Problem:
    question: str
    solution: str   # worked solution ending in "#### N"
    answer: int
    key: str        # number/operation combination, e.g. "23+15-9"

    def to_dict(self) -> dict:
        return asdict(self)


def is_heldout(key: str, cfg: DataConfig) -> bool:
    """Stable (seeded, process-independent) assignment of a combination to the held-out split."""
    h = hashlib.sha256(f"{cfg.split_seed}:{key}".encode()).digest()
    return int.from_bytes(h[:8], "big") / 2**64 < cfg.heldout_fraction


def _sample_numbers(rng: random.Random, cfg: DataConfig) -> tuple[list[int], list[str]]:
    """Draw operands and operations whose running value stays within [0, max_value]."""
    n_ops = rng.randint(cfg.min_ops, cfg.max_ops)
    while True:
        value = rng.randint(1, cfg.max_operand)
        nums, ops = [value], []
        for _ in range(n_ops):
            op = rng.choice(cfg.ops)
            hi = cfg.max_operand if op == "+" else min(cfg.max_operand, value)
            hi = min(hi, cfg.max_value - value) if op == "+" else hi
            if hi < 1:
                break
            n = rng.randint(1, hi)
            value = value + n if op == "+" else value - n
            nums.append(n)
            ops.append(op)
        if len(ops) == n_ops:
            return nums, ops


def make_problem(nums: list[int], ops: list[str], rng: random.Random) -> Problem:
    """Word the combination (numbers, operations) as a question with a worked solution."""
    name, obj = rng.choice(NAMES), rng.choice(OBJECTS)
    p = PRONOUN[name]
    sentences = [f"{name} has {nums[0]} {obj}."]
    steps, value = [], nums[0]
    for op, n in zip(ops, nums[1:]):
        sentences.append(rng.choice(PHRASES[op]).format(p=p, n=n))
        new = value + n if op == "+" else value - n
        steps.append(f"{value}{op}{n}={new}.")
        value = new
    sentences.append(f"How many {obj} now?")
    key = str(nums[0]) + "".join(f"{op}{n}" for op, n in zip(ops, nums[1:]))
    return Problem(" ".join(sentences), " ".join(steps) + f" #### {value}", value, key)


def make_story(nums: list[int], ops: list[str], rng: random.Random) -> Problem:
    """The same combination as a long word problem with a worked chain-of-thought answer."""
    from sinklens.train.story import story
    question, solution, value = story(nums, ops, rng, NAMES, PRONOUN, OBJECTS)
    key = str(nums[0]) + "".join(f"{op}{n}" for op, n in zip(ops, nums[1:]))
    return Problem(question, solution, value, key)


def generate(n: int, seed: int, split: str, cfg: DataConfig = DataConfig()) -> list[Problem]:
    """`n` problems of `split` ("train" or "heldout"), deterministic given (seed, split, cfg)."""
    if split not in ("train", "heldout"):
        raise ValueError(f"split must be 'train' or 'heldout', got {split!r}")
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    want_heldout = split == "heldout"
    # Different streams for the two splits, so the same seed never yields related problems.
    rng = random.Random(f"{seed}:{split}")
    out: list[Problem] = []
    while len(out) < n:
        nums, ops = _sample_numbers(rng, cfg)
        key = str(nums[0]) + "".join(f"{op}{x}" for op, x in zip(ops, nums[1:]))
        if is_heldout(key, cfg) == want_heldout:
            out.append(make_story(nums, ops, rng) if cfg.style == "story" else make_problem(nums, ops, rng))
    return out


class ProblemStream:
    """Endless, resumable stream of training problems: problem i depends only on (seed, i)."""

    def __init__(self, seed: int, cfg: DataConfig = DataConfig()):
        self.seed, self.cfg = seed, cfg

    def batch(self, index: int, size: int) -> list[Problem]:
        # One independent generator per batch index: resuming at batch k needs no replay.
        return generate(size, seed=self.seed * 1_000_003 + index, split="train", cfg=self.cfg)
