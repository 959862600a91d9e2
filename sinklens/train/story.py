"""Long word problems with worked chain-of-thought answers: the paper's regime at CPU scale.

The tiny twins' default problems are ~33 tokens long, so masking K = 10 keys blocks 30 % of a
sequence, while the paper's 8B runs block < 1 %. This wording of the *same* combinations
(numbers and operations, same held-out split) makes prompts >= 48 tokens and answers >= 128
tokens for 2-3 operations, so K = 1..10 is a small share of S:

    Q: Mia keeps some pens in a box at home. At the start of the day there are 23 pens in the
       box. In the morning she gets 15 more pens. In the evening she gives away 9 pens. How many
       pens are in Mia's box at the end of the day?
    A: We follow the pens in Mia's box one event at a time. At the start there are 23 pens.
       In the morning she gets 15 more pens, so we add: 23 + 15 = 38. Now there are 38 pens.
       We check it: 38 - 15 = 23, which is where we started. ... The answer is 29. #### 29

Every value is computed here with Python's own arithmetic (and checked by `tests/test_train.py`).
"""
from __future__ import annotations

import random
import re

# one worked step or check of an answer: "23 + 15 = 38"
EQUATION = re.compile(r"(\d+) ([+-]) (\d+) = (\d+)")

TIMES = ["In the morning", "At noon", "In the afternoon", "In the evening", "At night"]
# (question clause, answer clause) per operation; {p} pronoun, {n} operand, {o} objects.
EVENTS = {
    "+": [("{p} gets {n} more {o}", "{p} gets {n} more {o}"),
          ("{p} buys {n} more {o} at the shop", "{p} buys {n} more {o}"),
          ("{p} finds {n} more {o} in the garden", "{p} finds {n} more {o}")],
    "-": [("{p} gives away {n} {o} to a friend", "{p} gives away {n} {o}"),
          ("{p} loses {n} {o} on the way to school", "{p} loses {n} {o}"),
          ("{p} sells {n} {o} at the market", "{p} sells {n} {o}")],
}


def story(nums: list[int], ops: list[str], rng: random.Random, names: list[str],
          pronoun: dict[str, str], objects: list[str]) -> tuple[str, str, int]:
    """(question, worked solution ending in '#### N', N) for one combination."""
    name, obj = rng.choice(names), rng.choice(objects)
    p = pronoun[name].lower()
    times = sorted(rng.sample(range(len(TIMES)), len(ops)))      # events in the order of the day
    q = [f"{name} keeps some {obj} in a box at home.",
         f"At the start of the day there are {nums[0]} {obj} in the box."]
    a = [f"We follow the {obj} in {name}'s box one event at a time.",
         f"At the start there are {nums[0]} {obj}."]
    value = nums[0]
    for t, op, n in zip(times, ops, nums[1:]):
        ask, tell = rng.choice(EVENTS[op])
        q.append(f"{TIMES[t]} {ask.format(p=p, n=n, o=obj)}.")
        new = value + n if op == "+" else value - n
        verb = "add" if op == "+" else "subtract"
        back = "-" if op == "+" else "+"
        a.append(f"{TIMES[t]} {tell.format(p=p, n=n, o=obj)}, so we {verb}: {value} {op} {n} = {new}. "
                 f"Now there are {new} {obj}. We check it: {new} {back} {n} = {value}, "
                 f"which is what we had before.")
        value = new
    q.append(f"How many {obj} are in {name}'s box at the end of the day?")
    a.append(f"So at the end of the day there are {value} {obj} in {name}'s box. "
             f"The answer is {value}. #### {value}")
    return " ".join(q), " ".join(a), value


def equations_right(answer: str) -> tuple[int, int]:
    """(right, written) of the equations "a ± b = c" in a generated answer, checked by Python.

    A graded score for twins too weak to get whole answers right: each answer has 4-6 such steps
    and checks, so masking that breaks the arithmetic shows here even when exact accuracy is low."""
    found = EQUATION.findall(answer)
    right = sum((int(a) + int(b) if op == "+" else int(a) - int(b)) == int(c) for a, op, b, c in found)
    return right, len(found)
