"""The ``units`` tasks: seeded unit conversions, two levels, a held-out split.

Level 1 converts between metric units of one dimension ("How many m are 3 km?"); level 2 crosses
systems (inches, feet, miles, ounces, pounds) and has one decimal. A task is the same task as another
when it asks the same conversion of the same amount (:func:`fingerprint`), whatever its id.
"""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import asdict, dataclass

LEVELS = (1, 2)
# Units in their dimension's base unit (metres, grams).
UNITS = {
    "length": {"mm": 0.001, "cm": 0.01, "m": 1.0, "km": 1000.0, "inch": 0.0254, "foot": 0.3048, "mile": 1609.344},
    "mass": {"mg": 0.001, "g": 1.0, "kg": 1000.0, "ounce": 28.349523125, "pound": 453.59237},
}
METRIC = {"mm", "cm", "m", "km", "mg", "g", "kg"}
HELD_OUT_PER_LEVEL = 20  # the held-out split: this many tasks of each level, from a seed no training batch uses
HELD_OUT_SEED = "held-out"


@dataclass(frozen=True)
class UnitsTask:
    task_id: str
    level: int
    amount: float
    from_unit: str
    to_unit: str
    answer: float
    split: str = "train"
    kind: str = "answer"  # the final check: the submitted number (what the verdict review says)

    @property
    def question(self) -> str:
        return f"How many {self.to_unit} are {self.amount:g} {self.from_unit}? Give the number."

    def to_dict(self) -> dict:
        return asdict(self)


def convert(amount: float, from_unit: str, to_unit: str) -> float:
    """``amount`` of ``from_unit`` in ``to_unit``; ValueError for an unknown unit or two dimensions."""
    for table in UNITS.values():
        if from_unit in table and to_unit in table:
            return amount * table[from_unit] / table[to_unit]
    known = sorted(u for t in UNITS.values() for u in t)
    raise ValueError(f"cannot convert {from_unit!r} to {to_unit!r}: both must be one of {known} and of one dimension")


def make_task(level: int, index: int, seed: int | str, split: str = "train") -> UnitsTask:
    if level not in LEVELS:
        raise ValueError(f"units levels are {list(LEVELS)}, got {level}")
    rng = random.Random(f"units:{seed}:{level}:{index}")
    dimension = rng.choice(sorted(UNITS))
    metric = sorted(u for u in UNITS[dimension] if u in METRIC)
    if level == 1:
        from_unit, to_unit = rng.sample(metric, 2)
    else:  # one side imperial, either way round
        other = rng.choice(sorted(u for u in UNITS[dimension] if u not in METRIC))
        from_unit, to_unit = (other, rng.choice(metric)) if rng.random() < 0.5 else (rng.choice(metric), other)
    amount = float(rng.randint(1, 99)) if level == 1 else round(rng.uniform(1, 99), 1)
    return UnitsTask(f"units-{seed}-l{level}-{index:04d}", level, amount, from_unit, to_unit,
                     convert(amount, from_unit, to_unit), split)


def fingerprint(task: UnitsTask) -> str:
    """What makes two tasks the same task: the conversion and the amount, ids and splits aside."""
    return hashlib.sha256(json.dumps([task.amount, task.from_unit, task.to_unit]).encode()).hexdigest()


def held_out_tasks(levels: tuple[int, ...] = LEVELS) -> list[UnitsTask]:
    return [make_task(lv, i, HELD_OUT_SEED, split="test") for lv in levels for i in range(HELD_OUT_PER_LEVEL)]


def training_tasks(seed: int, num_tasks: int, levels: tuple[int, ...]) -> list[UnitsTask]:
    """``num_tasks`` tasks of ``seed``, levels in turn, skipping any that is a held-out task."""
    if num_tasks < 1 or not levels or any(lv not in LEVELS for lv in levels):
        raise ValueError(f"units: num_tasks >= 1 and levels a non-empty subset of {list(LEVELS)} (got {num_tasks}, {list(levels)})")
    held = {fingerprint(t) for t in held_out_tasks()}
    out, next_index = [], dict.fromkeys(levels, 0)
    for i in range(num_tasks):
        level = levels[i % len(levels)]
        while True:
            task = make_task(level, next_index[level], seed)
            next_index[level] += 1
            if fingerprint(task) not in held:
                break
        out.append(task)
    return out
