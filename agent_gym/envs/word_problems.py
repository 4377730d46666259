"""Arithmetic word problems for the calculator env, and the checker of their numeric answers.

Each problem is 2-4 operations on multi-digit numbers; its gold decomposition lists the ``calculate`` calls that
solve it, so the scripted oracle can replay them.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction

from agent_gym.error import InvalidValue
from agent_gym.tasks import Hop, Task, in_test_split
from agent_gym.tools.calculator import format_number, safe_eval

__all__ = ["NumberChecker", "generate_arithmetic_tasks", "parse_number"]

TEST_FRACTION = 0.2
SPLITS = ("train", "test")


# ---------------------------------------------------------------------------------------------- answers

_NUMBER = re.compile(r"(?P<sign>[-−])?\s*\$?\s*(?P<whole>\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?P<fraction>\.\d+)?")
_MAX_ANSWER_CHARS = 1_000


def parse_number(text: str) -> Fraction | None:
    """The first number written in ``text`` ("$5,888", "5888.0", "5888 crates"), or None if there is none."""
    if not isinstance(text, str):
        return None
    match = _NUMBER.search(text[:_MAX_ANSWER_CHARS])
    if match is None:
        return None
    value = Fraction(match["whole"].replace(",", "") + (match["fraction"] or ""))
    return -value if match["sign"] else value


@dataclass(frozen=True)
class NumberChecker:
    """``checker(answer_text) -> 1.0`` when the answer's first number equals ``target``, else ``0.0``.

    Only the first number counts, so an answer that lists many numbers cannot hit the target by chance.
    A module-level class (not a lambda) so that environments holding it pickle for ``AsyncVectorEnv``.
    """

    target: str

    def __call__(self, answer_text: str) -> float:
        value = parse_number(answer_text)
        return float(value is not None and value == Fraction(self.target))


# ---------------------------------------------------------------------------------------------- word problems


class _Steps:
    """Records a problem's solution as calculator hops; each hop's query is a standalone expression."""

    def __init__(self) -> None:
        self.hops: list[Hop] = []

    def do(self, question: str, expression: str) -> int:
        value = safe_eval(expression)
        assert isinstance(value, int), f"word problems have whole-number steps: {expression} = {value}"
        self.hops.append(Hop(question, format_number(value), expression, ""))
        return value


def _warehouse(rng: random.Random, steps: _Steps) -> str:
    stock, shipped = rng.randint(2_000, 9_000), rng.randint(500, 1_999)
    deliveries, per_delivery = rng.randint(3, 9), rng.randint(120, 980)
    left = steps.do("How many crates are left after Monday's shipment?", f"{stock} - {shipped}")
    received = steps.do("How many crates do the deliveries bring?", f"{deliveries} * {per_delivery}")
    steps.do("How many crates does the warehouse hold now?", f"{left} + {received}")
    return (
        f"A warehouse holds {stock:,} crates. It ships {shipped:,} crates on Monday and receives "
        f"{deliveries} deliveries of {per_delivery:,} crates each. How many crates does it hold now?"
    )


def _bakery(rng: random.Random, steps: _Steps) -> str:
    loaves, loaf_price = rng.randint(600, 2_500), rng.randint(3, 9)
    cakes, cake_price = rng.randint(120, 700), rng.randint(14, 48)
    bread = steps.do("How much do the loaves bring in?", f"{loaves} * {loaf_price}")
    cake = steps.do("How much do the cakes bring in?", f"{cakes} * {cake_price}")
    revenue = steps.do("What is the week's revenue?", f"{bread} + {cake}")
    costs = rng.randint(revenue // 3, revenue - 100)
    steps.do("What is the profit?", f"{revenue} - {costs}")
    return (
        f"A bakery sells {loaves:,} loaves at ${loaf_price} each and {cakes:,} cakes at ${cake_price} each "
        f"in a week. Its costs for the week are ${costs:,}. What is its profit for the week, in dollars?"
    )


def _orchard(rng: random.Random, steps: _Steps) -> str:
    rows, trees, apples = rng.randint(12, 48), rng.randint(15, 60), rng.randint(85, 240)
    kept = rng.randint(300, 2_000)
    total_trees = steps.do("How many trees are in the orchard?", f"{rows} * {trees}")
    harvest = steps.do("How many apples does the orchard yield?", f"{total_trees} * {apples}")
    steps.do("How many apples are sold?", f"{harvest} - {kept}")
    return (
        f"An orchard has {rows} rows of {trees} trees, and each tree yields {apples} apples. The farm keeps "
        f"{kept:,} apples and sells the rest. How many apples does it sell?"
    )


def _train(rng: random.Random, steps: _Steps) -> str:
    speed_1, hours_1 = rng.randint(65, 140), rng.randint(3, 12)
    speed_2, hours_2 = rng.randint(65, 140), rng.randint(3, 12)
    first = steps.do("How far does the train go in the first part?", f"{speed_1} * {hours_1}")
    second = steps.do("How far does the train go in the second part?", f"{speed_2} * {hours_2}")
    steps.do("How far does the train go in total?", f"{first} + {second}")
    return (
        f"A freight train travels at {speed_1} km/h for {hours_1} hours, then at {speed_2} km/h for "
        f"{hours_2} hours. How many kilometres does it cover in total?"
    )


def _savings(rng: random.Random, steps: _Steps) -> str:
    monthly, months = rng.randint(180, 950), rng.randint(9, 36)
    saved_estimate = monthly * months
    spent = rng.randint(saved_estimate // 5, saved_estimate - 150)
    saved = steps.do("How much is saved in total?", f"{monthly} * {months}")
    steps.do("How much is left after the trip?", f"{saved} - {spent}")
    return (
        f"Mara saves ${monthly} every month for {months} months, then spends ${spent:,} on a trip. "
        f"How many dollars does she have left?"
    )


def _factory(rng: random.Random, steps: _Steps) -> str:
    box_size = rng.choice((12, 24, 36, 48, 50, 64))
    boxes_per_day, days = rng.randint(40, 400), rng.randint(5, 30)
    per_day = box_size * boxes_per_day
    made = steps.do("How many bolts are made in total?", f"{per_day} * {days}")
    steps.do("How many boxes do they fill?", f"{made} / {box_size}")
    return (
        f"A factory makes {per_day:,} bolts a day for {days} days and packs them in boxes of {box_size}. "
        f"How many boxes does it fill?"
    )


def _stadium(rng: random.Random, steps: _Steps) -> str:
    sections, seats = rng.randint(18, 60), rng.randint(600, 1_800)
    capacity_estimate = sections * seats
    closed = rng.randint(capacity_estimate // 20, capacity_estimate // 6)
    sold = rng.randint(capacity_estimate // 3, capacity_estimate - closed - 100)
    capacity = steps.do("How many seats does the stadium have?", f"{sections} * {seats}")
    open_seats = steps.do("How many seats are open?", f"{capacity} - {closed}")
    steps.do("How many open seats are still empty?", f"{open_seats} - {sold}")
    return (
        f"A stadium has {sections} sections of {seats:,} seats. For a match, {closed:,} seats are closed for "
        f"repairs and {sold:,} tickets are sold, one per open seat. How many open seats are still empty?"
    )


def _discount(rng: random.Random, steps: _Steps) -> str:
    price, percent, quantity = 20 * rng.randint(10, 150), 5 * rng.randint(1, 9), rng.randint(12, 95)
    discount = steps.do("How much is the discount on one item?", f"{price} * {percent} / 100")
    unit = steps.do("What does one item cost after the discount?", f"{price} - {discount}")
    steps.do("What do all the items cost?", f"{unit} * {quantity}")
    return (
        f"A laptop costs ${price:,}. A school buys {quantity} of them with a {percent}% discount on each. "
        f"How many dollars does the school pay?"
    )


def _tank(rng: random.Random, steps: _Steps) -> str:
    capacity, rate, hours = rng.randint(8_000, 30_000), rng.randint(120, 480), rng.randint(6, 16)
    refill = rng.randint(900, 4_000)
    drained = steps.do("How much water drains out?", f"{rate} * {hours}")
    remaining = steps.do("How much is left after draining?", f"{capacity} - {drained}")
    steps.do("How much is in the tank after the refill?", f"{remaining} + {refill}")
    return (
        f"A tank holds {capacity:,} litres of water. It drains {rate} litres per hour for {hours} hours and "
        f"is then topped up with {refill:,} litres. How many litres does it hold now?"
    )


def _fundraiser(rng: random.Random, steps: _Steps) -> str:
    charities = rng.choice((8, 12, 16, 20, 25, 40))
    share_estimate = rng.randint(300, 1_500)
    total_target = charities * share_estimate
    fair = rng.randint(total_target // 4, 3 * total_target // 4)
    donations = total_target - fair
    total = steps.do("How much is raised in total?", f"{fair} + {donations}")
    steps.do("How much does each charity get?", f"{total} / {charities}")
    return (
        f"A club raises ${fair:,} at a fair and ${donations:,} from donations, and splits the total equally "
        f"among {charities} charities. How many dollars does each charity get?"
    )


_TEMPLATES: tuple[Callable[[random.Random, _Steps], str], ...] = (
    _warehouse, _bakery, _orchard, _train, _savings, _factory, _stadium, _discount, _tank, _fundraiser,
)  # fmt: skip


def generate_arithmetic_tasks(n: int, seed: int = 0, split: str = "train") -> list[Task]:
    """``n`` distinct arithmetic word problems of 2-4 operations on multi-digit numbers.

    Each task's answer is the exact integer result; its decomposition lists the calculator calls that solve
    it (``hop.query`` is the expression, ``hop.answer`` its value); its checker accepts "5,888", "$5,888",
    "5888.0" or "5888 crates". The same (n, seed, split) always gives the same tasks, a shorter draw is a
    prefix of a longer one, and the train and test splits are disjoint.
    """
    if split not in SPLITS:
        raise InvalidValue(f"split must be one of {SPLITS}, got {split!r}")
    if not isinstance(n, int) or n < 0:
        raise InvalidValue(f"n must be a non-negative int, got {n!r}")
    rng = random.Random(f"calculator-{seed}-{split}")  # a str seed is hashed with SHA-512: same everywhere
    want_test = split == "test"
    tasks: list[Task] = []
    seen: set[str] = set()
    while len(tasks) < n:
        template = _TEMPLATES[len(tasks) % len(_TEMPLATES)]
        steps = _Steps()
        question = template(rng, steps)
        if question in seen or in_test_split(question, TEST_FRACTION) != want_test:
            continue
        seen.add(question)
        answer = steps.hops[-1].answer
        tasks.append(
            Task(
                id=f"calc-{split}-s{seed}-{len(tasks)}",
                question=question,
                answers=(answer,),
                decomposition=tuple(steps.hops),
                kind="arithmetic",
                metadata={"operations": len(steps.hops), "template": template.__name__.lstrip("_")},
                checker=NumberChecker(answer),
            )
        )
    return tasks
