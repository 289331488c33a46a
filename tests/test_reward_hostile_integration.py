"""The test of ``tests/unit/test_reward_hostile.py`` that costs more CPU than the unit tier allows
(tests/cpu_budget.py): every pattern that reads model output does work linear in its length, checked by how
the work grows from one size to eight times it (in CPU time, never against a wall-clock limit). Moved here
unchanged; the unit file keeps the rest."""

from __future__ import annotations

import time
import timeit
from fractions import Fraction

import pytest

from tentalis_pipelines.rewards import math_answers as ma
from tentalis_pipelines.rewards import process
from tentalis_pipelines.rewards import remote_reward as rr

PROMPT = "Tom has 12 marbles and finds 7 more. How many marbles does he have?"


def _cost(fn, text: str, number: int) -> float:
    # CPU time of this thread, not the wall clock: a busy machine (another process on the cores) does not
    # change it, so the ratio below measures the work and not the load.
    return min(timeit.repeat(lambda: fn(text), number=number, repeat=3, timer=time.thread_time))


def _growth(fn, make, small: int = 1000, factor: int = 8) -> float:
    """How the work of ``fn`` grows when its input grows ``factor``-fold: about ``factor`` when linear,
    ``factor ** 2`` when quadratic. Calls are repeated until the small input's work is measurable."""
    a, b = make(small), make(small * factor)
    number = 1
    while (t := _cost(fn, a, number)) < 0.005:
        number *= 4
    return _cost(fn, b, number) / t


def _fill(unit: str):
    return lambda n: (unit * (n // len(unit) + 1))[:n]


# Inputs that made the old patterns retry from every start (or at every split of a run of blanks).
HOSTILE = {
    "operators without '='": _fill("1+"),  # the 50 s query of the issue: quadratic in process._EQ
    "'x' operators without '='": _fill("12 x "),
    "blanks after a number": lambda n: "1" + " " * n + "(",  # two \s* competing for the same blanks
    "digits": _fill("9"),
    "thousands separators": _fill("1,"),
    "open parentheses": _fill("(1 "),
    "unclosed answer tags": _fill("<answer>"),  # <answer>(.*?)</answer> from every opening
    "unclosed boxes": _fill("\\boxed{"),
    "unclosed text commands": _fill("\\text{"),
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_scoring_hostile_text_grows_linearly(name):
    make = HOSTILE[name]

    def score(text: str) -> None:
        rr.score_query(text, PROMPT, "42")
        process.check_step(text, {Fraction(12)})
        ma.reference_answer(text)
        ma.answers_match(text, "\\text{abc}")

    ratio = _growth(score, make)
    assert ratio < 20, f"{name}: 8x the input cost {ratio:.1f}x the work (linear: ~8, quadratic: ~64)"
