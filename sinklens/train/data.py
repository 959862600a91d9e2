"""Synthetic GSM8K-style arithmetic word problems with worked solutions and a `#### N` answer.

    Q: "Tom had 48 apples. He sold 19 of them. How many apples does he have left?"
    A: "48-19=29. #### 29"

Why synthetic: no GSM8K train split is available offline, and a CPU-sized model can only learn
a task whose difficulty we control. Knobs: operand range, number of operations, which
operations. Prompts and answers are kept short so few tokens are wasted (a CPU-sized budget).

Two held-out kinds, both never seen in training:
- by number combination ("heldout"): every problem has a *combination* key (its numbers and
  operations); a fixed fraction of all combinations is reserved and the train sampler rejects
  them. These problems use the training wordings.
- by wording ("heldout-wording"): a few whole templates per operation (wordings.py) are reserved
  and never used in training; these problems also use held-out combinations, so nothing in them
  (sentences or numbers) was seen in training.
"""
from __future__ import annotations

import hashlib
import random
from dataclasses import asdict, dataclass

from sinklens.params import check_fields, param
from sinklens.train import wordings
from sinklens.train.wordings import TEMPLATES, THEN, Template

SPLITS = ("train", "heldout", "heldout-wording")
# The long "story" wording's cast (story.py); the short problems' is in wordings.py.
NAMES = ["Tom", "Mia", "Sam", "Ana", "Ben", "Eva", "Leo", "Zoe", "Max", "Ivy", "Dan", "Amy"]
# (singular pronoun, object) pairs are decided per problem; pronoun follows the name.
PRONOUN = {"Tom": "He", "Sam": "He", "Ben": "He", "Leo": "He", "Max": "He", "Dan": "He",
           "Mia": "She", "Ana": "She", "Eva": "She", "Zoe": "She", "Ivy": "She", "Amy": "She"}
OBJECTS = ["apples", "pens", "cards", "coins", "books", "eggs", "cups", "toys", "rocks", "shells"]


@dataclass(frozen=True)
class DataConfig:
    """Difficulty knobs of the generator (each a `sinklens train` flag)."""
    max_operand: int = param(50, int, "operands drawn from [1, N]", min=1)
    min_ops: int = param(1, int, "fewest operations per problem", min=1)
    max_ops: int = param(2, int, "most operations per problem", min=1)
    ops: str = param("+-", str, "allowed operations, a subset of +-, e.g. + or +-")
    max_value: int = param(99, int, "every intermediate result stays in [0, N]", min=1)
    heldout_fraction: float = param(0.1, float, "share of operand combinations held out", gt=0, lt=1)
    split_seed: int = param(0, int, "decides which combinations and wordings are held out")
    heldout_templates: int = param(5, int, "wordings (templates) per operation held out, never in training",
                                   min=1)
    style: str = param("short", str, "short: one sentence per event, bare sums; story: the paper's regime, "
                       "prompts >= 48 tokens, worked answers >= 128 (story.py)", choices=("short", "story"))

    def __post_init__(self):
        check_fields(self)
        if not self.min_ops <= self.max_ops:
            raise ValueError(f"need 1 <= min_ops <= max_ops, got {self.min_ops}, {self.max_ops}")
        if not self.ops or set(self.ops) - set(TEMPLATES):
            raise ValueError(f"ops must be a non-empty subset of {''.join(TEMPLATES)!r}, got {self.ops!r}")
        fewest = min(len(t) for t in TEMPLATES.values())
        if self.heldout_templates >= fewest:
            raise ValueError(f"heldout_templates must leave training wordings: < {fewest}, "
                             f"got {self.heldout_templates}")
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


def heldout_templates(op: str, cfg: DataConfig) -> set[int]:
    """Indices of the templates of `op` reserved for the held-out-by-wording split (seeded)."""
    rank = sorted(range(len(TEMPLATES[op])),
                  key=lambda i: hashlib.sha256(f"{cfg.split_seed}:wording:{op}:{i}".encode()).digest())
    return set(rank[:cfg.heldout_templates])


def templates(op: str, wording_heldout: bool, chain: bool, cfg: DataConfig) -> list[Template]:
    """The templates of `op` on one side of the wording split (only chainable ones if `chain`)."""
    held = heldout_templates(op, cfg)
    return [t for i, t in enumerate(TEMPLATES[op])
            if (i in held) == wording_heldout and (t.chain or not chain)]


def combination_key(nums: list[int], ops: list[str]) -> str:
    return str(nums[0]) + "".join(f"{op}{n}" for op, n in zip(ops, nums[1:]))


def make_problem(nums: list[int], ops: list[str], rng: random.Random, template: Template) -> Problem:
    """Word the combination (numbers, operations) with `template` and write the worked solution."""
    male = rng.random() < 0.5
    cast = wordings.MALE if male else wordings.FEMALE
    name = rng.choice(cast)
    friend = rng.choice([n for n in wordings.MALE + wordings.FEMALE if n != name])
    obj = rng.choice(template.objects or wordings.OBJECTS)
    slots = dict(name=name, friend=friend, obj=obj, box=rng.choice(wordings.BOXES), a=nums[0], b=nums[1],
                 P="He" if male else "She", p="he" if male else "she", pos="his" if male else "her",
                 them="him" if male else "her")
    sentences = [template.body.format(**slots)] if template.body else []
    sentences += [rng.choice(THEN[op]).format(n=n, **slots) for op, n in zip(ops[1:], nums[2:])]
    sentences.append(template.question.format(**slots))
    steps, value = [], nums[0]
    for op, n in zip(ops, nums[1:]):
        new = value + n if op == "+" else value - n
        steps.append(f"{value}{op}{n}={new}.")
        value = new
    return Problem(" ".join(sentences), " ".join(steps) + f" #### {value}", value, combination_key(nums, ops))


def make_story(nums: list[int], ops: list[str], rng: random.Random) -> Problem:
    """The same combination as a long word problem with a worked chain-of-thought answer."""
    from sinklens.train.story import story
    question, solution, value = story(nums, ops, rng, NAMES, PRONOUN, OBJECTS)
    return Problem(question, solution, value, combination_key(nums, ops))


def generate(n: int, seed: int, split: str, cfg: DataConfig = DataConfig()) -> list[Problem]:
    """`n` problems of `split` (one of SPLITS), deterministic given (seed, split, cfg).
    "heldout": held-out number combinations in training wordings; "heldout-wording": held-out
    combinations in held-out wordings (the short style only; the story style has one wording)."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if split == "heldout-wording" and cfg.style == "story":
        raise ValueError("split 'heldout-wording' needs the short style: the story style has one wording")
    want_heldout = split != "train"
    # Different streams for the splits, so the same seed never yields related problems.
    rng = random.Random(f"{seed}:{split}")
    out: list[Problem] = []
    while len(out) < n:
        nums, ops = _sample_numbers(rng, cfg)
        if is_heldout(combination_key(nums, ops), cfg) != want_heldout:
            continue
        if cfg.style == "story":
            out.append(make_story(nums, ops, rng))
        else:
            choices = templates(ops[0], split == "heldout-wording", len(ops) > 1, cfg)
            if not choices:
                raise ValueError(f"no {'held-out' if split == 'heldout-wording' else 'training'} wording of "
                                 f"{ops[0]!r} takes later operations: lower heldout_templates or max_ops")
            out.append(make_problem(nums, ops, rng, rng.choice(choices)))
    return out


class ProblemStream:
    """Endless, resumable stream of training problems: problem i depends only on (seed, i)."""

    def __init__(self, seed: int, cfg: DataConfig = DataConfig()):
        self.seed, self.cfg = seed, cfg

    def batch(self, index: int, size: int) -> list[Problem]:
        # One independent generator per batch index: resuming at batch k needs no replay.
        return generate(size, seed=self.seed * 1_000_003 + index, split="train", cfg=self.cfg)
