"""The ways a person words a one-operation word problem: the templates of the short problems.

Each template is a (body, question) pair for one operation, `a op b`: the body states the start
value `{a}` and the event `{b}`, the question asks for the result. A whole template is the unit of
the held-out-by-wording split (data.py): a held-out template's sentences never occur in training.

Placeholders: {name} the person, {friend} another person, {P}/{p} the person's pronoun
(He/he, She/she), {pos} his/her, {them} him/her, {obj} a plural object, {box} a container.
A template whose `objects` is set draws its object from that list (one eats food, not coins).
`chain`: later operations of a multi-operation problem may follow the body as "Then {p} ..."
sentences (the body's subject is the person, and the question does not name the event).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Template:
    body: str
    question: str
    chain: bool = True
    objects: tuple[str, ...] | None = None


MALE = ["Tom", "Sam", "Ben", "Leo", "Max", "Dan", "Jack", "Noah", "Liam", "Lucas", "Omar", "Paul"]
FEMALE = ["Mia", "Ana", "Eva", "Zoe", "Ivy", "Amy", "Lily", "Emma", "Sara", "Nina", "Rosa", "Kate"]
OBJECTS = ["apples", "pens", "cards", "coins", "books", "eggs", "cups", "toys", "rocks", "shells",
           "stickers", "marbles", "candies", "cookies", "pencils", "balloons", "stamps", "flowers",
           "oranges", "tickets", "beads", "shirts"]
FOOD = ("apples", "eggs", "candies", "cookies", "oranges", "grapes", "cherries", "muffins")
BOXES = ["the box", "the bag", "the basket", "the jar", "the drawer"]

T = Template
TEMPLATES: dict[str, list[Template]] = {
    "+": [
        T("{name} has {a} {obj}. {P} gets {b} more.", "How many {obj} does {p} have now?"),
        T("{name} had {a} {obj}. {P} bought {b} more.", "How many {obj} does {p} have now?"),
        T("{name} has {a} {obj}. {P} finds {b} more {obj}.", "How many {obj} does {p} have in total?"),
        T("{name} has {a} {obj}. {friend} gives {them} {b} more.", "How many {obj} does {name} have now?"),
        T("There are {a} {obj} in {box}. {name} puts {b} more {obj} in {box}.",
          "How many {obj} are in {box} now?", chain=False),
        T("{name} collected {a} {obj} on Monday and {b} {obj} on Tuesday.",
          "How many {obj} did {p} collect in total?", chain=False),
        T("{name} has {a} {obj} and {friend} has {b} {obj}.", "How many {obj} do they have together?",
          chain=False),
        T("", "If {name} has {a} {obj} and gets {b} more, how many {obj} does {p} have?", chain=False),
        T("{name} starts with {a} {obj}. Then {p} wins {b} {obj}.", "How many {obj} does {p} have now?"),
        T("{name} owns {a} {obj}. {P} receives {b} {obj} as a gift.", "How many {obj} does {p} own now?"),
        T("A shop has {a} {obj}. It gets a delivery of {b} more {obj}.",
          "How many {obj} does the shop have now?", chain=False),
        T("{name} has {a} {obj} in {pos} bag. {P} adds {b} more.", "How many {obj} are in the bag now?"),
        T("{name} picked {a} {obj} yesterday. Today {p} picks {b} more.",
          "How many {obj} has {p} picked altogether?", objects=FOOD, chain=False),
        T("{name} had {a} {obj} and {p} got {b} more.", "How many {obj} does {p} have now?"),
        T("{name} saved {a} {obj}. {P} earns {b} more {obj}.", "How many {obj} does {p} have saved now?"),
        T("", "What is the total number of {obj} if {name} has {a} {obj} and buys {b} more?", chain=False),
        T("{name} has {a} {obj}. {P} makes {b} more.", "How many {obj} does {p} have now?"),
        T("{name} has {a} {obj}. {P} is given {b} more {obj}.", "How many {obj} does {p} have?"),
        T("{name} counted {a} {obj}. Later {p} found another {b}.", "How many {obj} are there in all?"),
        T("{name} has {a} {obj}. {P} gets {b} more.", "How many {obj} in total?"),
        T("{name} read {a} pages on Monday and {b} pages on Tuesday.", "How many pages did {p} read?",
          chain=False),
        T("{name} has {a} {obj}. {P} buys {b} more {obj} at the store.", "How many {obj} does {name} have now?"),
        T("{name} has {a} {obj}.", "How many {obj} will {p} have after getting {b} more?", chain=False),
        T("There were {a} {obj} on the table. {name} brought {b} more.",
          "How many {obj} are on the table now?", chain=False),
        T("{name} has {a} {obj}. {P} gets {b} more {obj} from {friend}.", "How many {obj} does {name} have now?"),
        T("", "{name} had {a} {obj}. After {p} got {b} more, how many {obj} did {p} have?", chain=False),
    ],
    "-": [
        T("{name} has {a} {obj}. {P} gives away {b}.", "How many {obj} does {p} have now?"),
        T("{name} has {a} {obj}. {P} loses {b} {obj}.", "How many {obj} are left?"),
        T("{name} had {a} {obj}. {P} sold {b} of them.", "How many {obj} does {p} have left?"),
        T("{name} has {a} {obj}. {P} eats {b}.", "How many {obj} remain?", objects=FOOD),
        T("{name} has {a} {obj}. {P} uses {b} of them.", "How many {obj} does {p} have left?"),
        T("{name} had {a} {obj}. {P} gave {b} to {friend}.", "How many {obj} does {name} have now?"),
        T("There are {a} {obj} in {box}. {name} takes out {b}.", "How many {obj} are in {box} now?",
          chain=False),
        T("{name} bought {a} {obj} and broke {b} of them.", "How many {obj} are not broken?",
          chain=False, objects=("cups", "plates", "glasses", "eggs", "bowls")),
        T("", "If {name} has {a} {obj} and loses {b}, how many {obj} are left?", chain=False),
        T("{name} starts with {a} {obj}. {P} spends {b} of them.", "How many {obj} remain?"),
        T("A shop has {a} {obj}. It sells {b} {obj}.", "How many {obj} does the shop have left?",
          chain=False),
        T("{name} has {a} {obj}. {friend} takes {b} of them.", "How many {obj} does {name} have now?"),
        T("{name} had {a} {obj}, but {p} lost {b}.", "How many {obj} does {p} have now?"),
        T("{name} has {a} {obj}. {P} drops {b} {obj}.", "How many {obj} does {p} still have?"),
        T("{name} had {a} {obj} and gave away {b}.", "How many {obj} does {p} have left?"),
        T("{name} has {a} {obj}. {P} throws away {b} of them.", "How many {obj} are left?"),
        T("{name} has {a} {obj}. {P} hands {b} to {friend}.", "How many {obj} does {name} keep?"),
        T("{name} needs to deliver {a} {obj}. {P} has delivered {b}.",
          "How many {obj} are still to deliver?", chain=False),
        T("There are {a} {obj} on the shelf. {name} sells {b} of them.",
          "How many {obj} are on the shelf now?", chain=False),
        T("{name} has {a} {obj}. {P} gives {b} to {pos} sister.", "How many {obj} does {p} have left?"),
        T("", "How many {obj} are left if {name} has {a} {obj} and uses {b}?", chain=False),
        T("{name} had {a} {obj}. {P} ate {b} of them.", "How many {obj} are left?", objects=FOOD),
        T("{name} has {a} {obj}. {P} sells {b}.", "How many {obj} does {p} have now?"),
        T("{name} owned {a} {obj}. {P} gave {b} away.", "How many {obj} does {p} own now?"),
        T("{name} has {a} {obj}. {b} of them break.", "How many {obj} are still whole?",
          chain=False, objects=("cups", "plates", "glasses", "eggs", "bowls")),
        T("{name} has {a} {obj}. {P} loses {b}.", "How many {obj} remain?"),
    ],
}
del T

# Later operations of a multi-operation problem (the person is the subject); {n} the operand.
THEN = {
    "+": ["Then {p} gets {n} more.", "Then {p} buys {n} more.", "Then {p} finds {n} more."],
    "-": ["Then {p} gives away {n}.", "Then {p} loses {n}.", "Then {p} sells {n}."],
}

# A few prompts the twins were trained to answer, for a user whose prompt they cannot read.
EXAMPLES = ["Mia has 23 pens. She gets 15 more. How many pens does she have now?",
            "Tom had 48 apples. He sold 19 of them. How many apples does he have left?"]


def vocabulary() -> list[str]:
    """Every text the short problems are made of (all templates, both sides of the split)."""
    texts = [t.body + " " + t.question for ts in TEMPLATES.values() for t in ts]
    texts += [x for ts in THEN.values() for x in ts]
    return texts + MALE + FEMALE + OBJECTS + list(FOOD) + BOXES + ["he she his her him"] + [
        o for ts in TEMPLATES.values() for t in ts for o in t.objects or ()]
