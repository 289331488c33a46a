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
