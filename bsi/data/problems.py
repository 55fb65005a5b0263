"""The embedded task: grade-school math word problems generated on the fly (no download).

Nine templates with one or two arithmetic steps on small numbers; train and
test splits come from different seeds and share no question.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator

from bsi.data.examples import Example, TaskData
from bsi.errors import BSIError

EMBEDDED_TASK = "embedded-math"
"""Spec of the built-in task: generated grade-school math word problems."""

DEFAULT_TRAIN_SIZE = 2000
"""Training examples generated for the embedded task when no size is given."""

_NAMES = (
    ("Amy", "she"), ("Ben", "he"), ("Carla", "she"), ("David", "he"), ("Emma", "she"),
    ("Farid", "he"), ("Grace", "she"), ("Hugo", "he"), ("Ines", "she"), ("Jack", "he"),
    ("Kira", "she"), ("Liam", "he"), ("Maya", "she"), ("Noah", "he"), ("Olivia", "she"),
    ("Pablo", "he"), ("Rosa", "she"), ("Sam", "he"), ("Tara", "she"), ("Victor", "he"),
)  # fmt: skip
_ITEMS = (
    "apples", "pencils", "stickers", "cookies", "marbles", "books", "oranges",
    "cards", "balloons", "shells", "stamps", "candies", "eggs", "toy cars",
)  # fmt: skip
_PRICED = (("notebook", "notebooks"), ("pen", "pens"), ("sandwich", "sandwiches"),
           ("ticket", "tickets"), ("toy", "toys"), ("cupcake", "cupcakes"), ("kite", "kites"))  # fmt: skip
_CONTAINERS = ("boxes", "bags", "baskets", "packs", "jars")
_VEHICLES = (("car", "km"), ("train", "km"), ("bike", "km"), ("bus", "km"), ("boat", "miles"))


def _person(rng: random.Random) -> tuple[str, str]:
    """A random first name and its pronoun."""
    return rng.choice(_NAMES)


def _two_people(rng: random.Random) -> tuple[tuple[str, str], tuple[str, str]]:
    """Two different random people."""
    first, second = rng.sample(_NAMES, 2)
    return first, second


def _cap(word: str) -> str:
    return word[0].upper() + word[1:]


def _gather(rng: random.Random) -> Example:
    # one addition: "has a, finds b more"
    (name, pron), item = _person(rng), rng.choice(_ITEMS)
    a, b = rng.randint(2, 20), rng.randint(2, 10)
    return Example(
        f"{name} has {a} {item}. {_cap(pron)} finds {b} more {item}. How many {item} does {name} have now?",
        f"{name} has {a} + {b} = {a + b} {item} now.\n#### {a + b}",
    )


def _give_away(rng: random.Random) -> Example:
    # one subtraction
    (name, _), item = _person(rng), rng.choice(_ITEMS)
    b = rng.randint(2, 10)
    a = b + rng.randint(1, 10)
    return Example(
        f"{name} had {a} {item} and gave {b} of them to a friend. How many {item} does {name} have left?",
        f"{name} has {a} - {b} = {a - b} {item} left.\n#### {a - b}",
    )


def _shopping(rng: random.Random) -> Example:
    # one multiplication: quantity x unit price
    (name, pron), (_, many) = _person(rng), rng.choice(_PRICED)
    count, price = rng.randint(2, 5), rng.randint(2, 5)
    return Example(
        f"{name} buys {count} {many} for ${price} each. How much money does {pron} spend?",
        f"{_cap(pron)} spends {count} x {price} = ${count * price}.\n#### {count * price}",
    )


def _change(rng: random.Random) -> Example:
    # two steps: cost, then change from a payment
    (name, pron), (_, many) = _person(rng), rng.choice(_PRICED)
    count, price = rng.randint(2, 3), rng.randint(2, 5)
    cost = count * price
    paid = 20
    return Example(
        f"{name} buys {count} {many} at ${price} each and pays with a ${paid} bill. How much change does {pron} get?",
        f"The {many} cost {count} x {price} = ${cost}.\n{_cap(pron)} gets {paid} - {cost} = ${paid - cost} back.\n#### {paid - cost}",
    )


def _sharing(rng: random.Random) -> Example:
    # one exact division
    (name, _), item = _person(rng), rng.choice(_ITEMS)
    friends, each = rng.randint(2, 5), rng.randint(2, 5)
    total = friends * each
    return Example(
        f"{name} shares {total} {item} equally among {friends} friends. How many {item} does each friend get?",
        f"Each friend gets {total} / {friends} = {each} {item}.\n#### {each}",
    )


def _containers(rng: random.Random) -> Example:
    # one multiplication: groups x size
    item, box = rng.choice(_ITEMS), rng.choice(_CONTAINERS)
    groups, size = rng.randint(2, 5), rng.randint(2, 6)
    return Example(
        f"There are {groups} {box} with {size} {item} in each. How many {item} are there in total?",
        f"There are {groups} x {size} = {groups * size} {item}.\n#### {groups * size}",
    )


def _ages(rng: random.Random) -> Example:
    # two additions: an age difference, then years ahead
    (name, _), (other, _) = _two_people(rng)
    age, gap, years = rng.randint(5, 15), rng.randint(2, 5), rng.randint(2, 5)
    now = age + gap
    return Example(
        f"{name} is {age} years old. {other} is {gap} years older than {name}. How old will {other} be in {years} years?",
        f"{other} is {age} + {gap} = {now} years old.\nIn {years} years {other} will be {now} + {years} = {now + years}.\n#### {now + years}",
    )


def _distance(rng: random.Random) -> Example:
    # one multiplication: speed x time (speeds are round tens)
    (name, pron), (vehicle, unit) = _person(rng), rng.choice(_VEHICLES)
    speed, hours = rng.randint(1, 9) * 10, rng.randint(2, 4)
    return Example(
        f"{name} travels by {vehicle} at {speed} {unit} per hour for {hours} hours. How many {unit} does {pron} travel?",
        f"{_cap(pron)} travels {speed} x {hours} = {speed * hours} {unit}.\n#### {speed * hours}",
    )


def _savings(rng: random.Random) -> Example:
    # two steps: weekly savings, then a purchase
    (name, pron) = _person(rng)
    weekly, weeks = rng.randint(2, 5), rng.randint(2, 3)
    saved = weekly * weeks
    spent = rng.randint(1, saved - 1)
    return Example(
        f"{name} saves ${weekly} every week for {weeks} weeks, then spends ${spent} on a game. How much money does {pron} have left?",
        f"{_cap(pron)} saves {weekly} x {weeks} = ${saved}.\n{_cap(pron)} has {saved} - {spent} = ${saved - spent} left.\n#### {saved - spent}",
    )


_TEMPLATES: tuple[Callable[[random.Random], Example], ...] = (
    _gather, _give_away, _shopping, _change, _sharing, _containers, _ages, _distance, _savings,
)  # fmt: skip


def _problem_stream(rng: random.Random, exclude: frozenset[str] = frozenset()) -> Iterator[Example]:
    """Endless distinct problems from ``rng``, skipping questions in ``exclude``."""
    seen = set(exclude)
    misses = 0
    while True:
        example = rng.choice(_TEMPLATES)(rng)
        if example.question in seen:
            misses += 1
            if misses > 100_000:  # the templates cannot produce that many distinct problems
                raise BSIError("cannot generate that many distinct math problems: ask for fewer")
            continue
        seen.add(example.question)
        yield example


def generate_math_problems(n: int, seed: int) -> list[Example]:
    """``n`` distinct grade-school math word problems, the same for the same seed.

    Nine templates (collecting, giving away, shopping, change, sharing,
    boxes, ages, distance, savings) with one or two arithmetic steps on small
    numbers (sums within 30, times tables up to 5 x 6, round-ten speeds):
    easy enough that SmolLM2-135M learns the task in a few dozen fine-tuning
    steps, while it gets few of them right before. Answers are short worked solutions in GSM8K's style, e.g.::

        Sam has 12 + 7 = 19 apples now.
        #### 19

    Only ``random.Random(seed)`` is used, so the global random state is not
    touched.
    """
    if n < 0:
        raise BSIError(f"cannot generate {n} problems: the count must be >= 0")
    stream = _problem_stream(random.Random(seed))
    return [next(stream) for _ in range(n)]


def embedded_task(test_size: int, train_size: int | None, seed: int, validation_size: int = 0) -> TaskData:
    """Generated train, test and validation splits with no shared question.

    Train and test come from different seeds. The validation problems are
    the test generator's next ones that are not training questions, so
    asking for a validation set changes neither the training nor the test
    set (nor a cached fine-tune).
    """
    train_size = DEFAULT_TRAIN_SIZE if train_size is None else train_size
    held_out = _problem_stream(random.Random(2 * seed + 1))
    test = [next(held_out) for _ in range(test_size)]
    stream = _problem_stream(random.Random(2 * seed), exclude=frozenset(e.question for e in test))
    train = [next(stream) for _ in range(train_size)]
    trained = {e.question for e in train}
    validation: list[Example] = []
    while len(validation) < validation_size:
        example = next(held_out)
        if example.question not in trained:
            validation.append(example)
    return TaskData(name=EMBEDDED_TASK, train=train, test=test, validation=validation)


