"""A seeded generator of arithmetic word problems with exact answers and difficulty levels.

Level 1 is one addition or subtraction with small numbers, level 2 one multiplication or a larger
sum, level 3 two operations, level 4 three operations. The same seed always gives the same tasks,
and different seeds give independent streams (held-out sets use a seed that training never uses).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass

NAMES = ["Ava", "Ben", "Chloe", "Dev", "Emma", "Farid", "Grace", "Hiro", "Ines", "Jonas", "Kemi", "Liam"]
ITEMS = ["apples", "marbles", "stickers", "books", "pencils", "coins", "shells", "cards", "cookies", "stamps"]


@dataclass(frozen=True)
class ArithmeticTask:
    task_id: str
    prompt: str
    answer: int
    expression: str
    level: int


def _level1(r: random.Random, name: str, item: str) -> tuple[str, str, int]:
    a, b = r.randint(2, 20), r.randint(2, 20)
    if r.random() < 0.5:
        return f"{name} has {a} {item} and gets {b} more. How many {item} does {name} have now?", f"{a} + {b}", a + b
    a, b = max(a, b), min(a, b)
    return f"{name} has {a} {item} and gives away {b}. How many {item} are left?", f"{a} - {b}", a - b


def _level2(r: random.Random, name: str, item: str) -> tuple[str, str, int]:
    if r.random() < 0.5:
        a, b = r.randint(2, 9), r.randint(3, 12)
        return f"{name} buys {a} boxes with {b} {item} in each box. How many {item} is that in total?", f"{a} * {b}", a * b
    a, b = r.randint(20, 99), r.randint(20, 99)
    return f"{name} collected {a} {item} on Monday and {b} on Tuesday. How many {item} in total?", f"{a} + {b}", a + b


def _level3(r: random.Random, name: str, item: str) -> tuple[str, str, int]:
    a, b, c = r.randint(2, 9), r.randint(3, 12), r.randint(1, 15)
    if r.random() < 0.5:
        return (
            f"{name} buys {a} packs of {b} {item} and then finds {c} more. How many {item} does {name} have?",
            f"{a} * {b} + {c}",
            a * b + c,
        )
    c = min(c, a * b - 1)
    return (
        f"{name} has {a} bags with {b} {item} each and gives {c} {item} to a friend. How many {item} are left?",
        f"{a} * {b} - {c}",
        a * b - c,
    )


def _level4(r: random.Random, name: str, item: str) -> tuple[str, str, int]:
    a, b, c, d = r.randint(2, 9), r.randint(3, 12), r.randint(2, 6), r.randint(1, 20)
    return (
        f"{name} has {a} shelves with {b} {item} each. {name} buys {c} times as many {item} as that, "
        f"then gives away {d}. How many {item} does {name} have now, counting the shelves too?",
        f"{a} * {b} + {a} * {b} * {c} - {d}",
        a * b + a * b * c - d,
    )


_LEVELS = {1: _level1, 2: _level2, 3: _level3, 4: _level4}


def generate_arithmetic(
    num_tasks: int, *, seed: int, levels: tuple[int, ...] = (1, 2), prefix: str | None = None
) -> list[ArithmeticTask]:
    """``num_tasks`` word problems, cycling through ``levels``, reproducible from ``seed``."""
    if num_tasks < 1:
        raise ValueError(f"num_tasks must be >= 1, got {num_tasks}")
    bad = [lv for lv in levels if lv not in _LEVELS]
    if bad or not levels:
        raise ValueError(f"levels must be a non-empty subset of {sorted(_LEVELS)}, got {list(levels)}")
    r = random.Random(seed)
    prefix = prefix or f"arith-s{seed}"
    out = []
    for i in range(num_tasks):
        level = levels[i % len(levels)]
        prompt, expr, answer = _LEVELS[level](r, r.choice(NAMES), r.choice(ITEMS))
        out.append(ArithmeticTask(f"{prefix}-{i:04d}", prompt, answer, expr, level))
    return out


# ------------------------------------------------------------------------------- the transfer set
# Held-out arithmetic written from other templates than the generator's above: other wording, larger
# numbers, division, and two-step problems. A policy that learned the generator's templates and their
# answer format, not the arithmetic, gains far less here (issue 32: measured on it, not assumed).


def _t_library(r: random.Random, name: str) -> tuple[str, str, int]:
    a = r.randint(120, 999)
    b = r.randint(20, a - 1)
    return f"A library had {a} books and lent out {b} of them. How many books are still in the library?", f"{a} - {b}", a - b


def _t_chairs(r: random.Random, name: str) -> tuple[str, str, int]:
    a, b = r.randint(12, 40), r.randint(6, 25)
    return f"A school orders {a} chairs for each of its {b} classrooms. How many chairs does the school order?", f"{a} * {b}", a * b


def _t_juice(r: random.Random, name: str) -> tuple[str, str, int]:
    b, q = r.randint(3, 12), r.randint(3, 25)
    return (f"{b * q} liters of juice are poured equally into {b} bottles. How many liters go into each bottle?",
            f"{b * q} / {b}", q)


def _t_trip(r: random.Random, name: str) -> tuple[str, str, int]:
    a, b = r.randint(100, 900), r.randint(100, 900)
    return f"The first leg of a trip is {a} km and the second leg is {b} km. How long is the whole trip in km?", f"{a} + {b}", a + b


def _t_tickets(r: random.Random, name: str) -> tuple[str, str, int]:
    p, n = r.randint(3, 15), r.randint(2, 6)
    bill = 50 if p * n < 50 else 100
    return (f"Tickets cost {p} dollars each. {name} buys {n} tickets and pays with a {bill} dollar bill. "
            f"How much change does {name} get, in dollars?", f"{bill} - {p} * {n}", bill - p * n)


def _t_crates(r: random.Random, name: str) -> tuple[str, str, int]:
    a, b = r.randint(4, 15), r.randint(6, 24)
    c = r.randint(1, min(30, a * b - 1))
    return (f"A warehouse receives {a} crates with {b} bottles in each crate. {c} bottles arrive broken and are thrown away. "
            f"How many bottles can be sold?", f"{a} * {b} - {c}", a * b - c)


def _t_savings(r: random.Random, name: str) -> tuple[str, str, int]:
    a, w = r.randint(15, 60), r.randint(3, 10)
    c = r.randint(10, a * w - 1)
    return (f"{name} saves {a} dollars every week for {w} weeks, then spends {c} dollars on a bike. "
            f"How many dollars does {name} have left?", f"{a} * {w} - {c}", a * w - c)


def _t_bus(r: random.Random, name: str) -> tuple[str, str, int]:
    a, b, c = r.randint(20, 60), r.randint(3, 19), r.randint(2, 25)
    return (f"A bus leaves the depot with {a} passengers. At the first stop {b} passengers get off and {c} get on. "
            f"How many passengers are on the bus now?", f"{a} - {b} + {c}", a - b + c)


# level 1: one step (other wording, larger numbers, division); level 2: two steps
TRANSFER_TEMPLATES = {1: (_t_library, _t_chairs, _t_juice, _t_trip), 2: (_t_tickets, _t_crates, _t_savings, _t_bus)}


def generate_transfer_arithmetic(num_tasks: int, *, seed: int, prefix: str = "transfer") -> list[ArithmeticTask]:
    """``num_tasks`` problems from the transfer templates, alternating one-step (level 1) and two-step
    (level 2) and cycling through each level's templates, reproducible from ``seed``."""
    if num_tasks < 1:
        raise ValueError(f"num_tasks must be >= 1, got {num_tasks}")
    r = random.Random(seed)
    out = []
    for i in range(num_tasks):
        level = 1 + i % 2
        templates = TRANSFER_TEMPLATES[level]
        prompt, expr, answer = templates[(i // 2) % len(templates)](r, r.choice(NAMES))
        out.append(ArithmeticTask(f"{prefix}-{i:04d}", prompt, answer, expr, level))
    return out


def arithmetic_task_rows(batch_id: str, tasks: list[ArithmeticTask], created_at) -> list[dict]:
    return [
        {
            "batch_id": batch_id,
            "task_id": t.task_id,
            "source": "generator:arithmetic",
            "environment": "math",
            "prompt": t.prompt,
            "reference": str(t.answer),
            "difficulty": t.level,
            "metadata": json.dumps({"expression": t.expression}),
            "created_at": created_at,
        }
        for t in tasks
    ]
