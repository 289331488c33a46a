"""The transfer set: held-out arithmetic from other templates than the training generator's."""

from __future__ import annotations

from fractions import Fraction

import pytest

from tentalis_pipelines.evaluation.benchmarks import load_benchmark
from tentalis_pipelines.rewards.process import evaluate
from tentalis_pipelines.tasks.arithmetic import generate_arithmetic, generate_transfer_arithmetic


def test_every_answer_is_its_expression_and_the_set_is_reproducible():
    tasks = generate_transfer_arithmetic(64, seed=5)
    assert [t.prompt for t in tasks] == [t.prompt for t in generate_transfer_arithmetic(64, seed=5)]
    assert [t.prompt for t in tasks] != [t.prompt for t in generate_transfer_arithmetic(64, seed=6)]
    for t in tasks:
        assert evaluate(t.expression) == Fraction(t.answer), t
        assert t.answer >= 0
    # one-step and two-step alternate; a two-step expression has two operators
    assert [t.level for t in tasks[:4]] == [1, 2, 1, 2]
    assert all(sum(t.expression.count(op) for op in "+-*/") == (1 if t.level == 1 else 2) for t in tasks)
    assert any("/" in t.expression for t in tasks) and max(t.answer for t in tasks) > 200  # division, larger numbers


def test_no_transfer_prompt_shares_a_template_with_the_training_generator():
    def shape(prompt: str) -> str:  # the template: words without numbers or names
        return " ".join(w for w in prompt.split() if not any(c.isdigit() for c in w))[:40]

    train = {shape(t.prompt) for t in generate_arithmetic(400, seed=1, levels=(1, 2, 3, 4))}
    transfer = {shape(t.prompt) for t in generate_transfer_arithmetic(64, seed=5)}
    assert not any(a.split()[1:] == b.split()[1:] for a in transfer for b in train)


def test_the_benchmark_is_64_items_by_default_and_graded_as_numbers():
    name, items = load_benchmark("arithmetic-transfer")
    assert name == "arithmetic-transfer" and len(items) == 64
    assert all(it.reference.lstrip("-").isdigit() for it in items)
    assert len(load_benchmark("arithmetic-transfer", limit=10)[1]) == 10
    with pytest.raises(ValueError, match="num_tasks"):
        generate_transfer_arithmetic(0, seed=1)
