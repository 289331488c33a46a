"""Level 0 of the terminal family (the command is named) without the sandbox: generation, the named
command's output computed here equals the expected answer, the oracle's submission passes and doing
nothing fails, and level 0 is opt-in and never trains on its held-out split (the episodes in the real
sandbox: tests/test_envs_tasks.py)."""

from __future__ import annotations

import json
import re
from datetime import datetime, timezone

import pytest

from tentalis_pipelines.envs.terminal_tasks import (
    ALL_LEVELS,
    FAMILIES,
    LEVELS,
    generate_tasks,
    make_task,
    split_counts,
    verify,
)
from tentalis_pipelines.tasks import batches

LEVEL0 = generate_tasks(levels=(0,))
COMMAND = re.compile(r"Run the command `(.+?)` and submit")


def run_named(command: str, tree: dict[str, str]) -> str:
    """What the named command prints, computed in Python (the six command shapes of level 0)."""
    if m := re.fullmatch(r"wc -l < (\S+)", command):
        return str(tree[m[1]].count("\n"))
    if m := re.fullmatch(r"grep -c (\S+) (\S+)", command):
        return str(sum(m[1] in line for line in tree[m[2]].splitlines()))
    if m := re.fullmatch(r"cut -d, -f(\d+) (\S+)", command):
        return tree[m[2]].rstrip("\n").split(",")[int(m[1]) - 1]
    if m := re.fullmatch(r"sed -n (\d+)p (\S+)", command):
        return tree[m[2]].splitlines()[int(m[1]) - 1]
    if m := re.fullmatch(r"tail -n 1 (\S+)", command):
        return tree[m[1]].splitlines()[-1]
    if m := re.fullmatch(r"cat (\S+)", command):
        return tree[m[1]].rstrip("\n")
    raise AssertionError(f"not a level-0 command: {command}")


def test_level_0_has_80_tasks_of_six_families_and_30_held_out():
    counts = split_counts(LEVEL0)
    assert counts == {(0, "test"): 30, (0, "train"): 50}
    assert {t.family for t in LEVEL0} == set(FAMILIES[0]) and len(FAMILIES[0]) == 6
    assert len({t.task_id for t in LEVEL0}) == 80
    assert len({(t.instruction, json.dumps(t.tree, sort_keys=True)) for t in LEVEL0}) == 80
    assert {t.kind for t in LEVEL0} == {"answer"}
    assert all(t.task_id.startswith("terminal-s0-l0-") for t in LEVEL0)


def test_level_0_is_deterministic_and_its_held_out_split_does_not_move():
    assert [t.to_dict() for t in generate_tasks(levels=(0,))] == [t.to_dict() for t in LEVEL0]
    assert generate_tasks(levels=(0,), seed=1)[0].tree != LEVEL0[0].tree
    small = [t for t in generate_tasks(35, levels=(0,)) if t.split == "test"]
    assert [t.to_dict() for t in small] == [t.to_dict() for t in LEVEL0[:30]]
    assert make_task(0, 41) == LEVEL0[41]


def test_level_0_is_opt_in_and_leaves_levels_1_to_3_as_they_were():
    assert LEVELS == (1, 2, 3) and ALL_LEVELS == (0, 1, 2, 3)
    default = generate_tasks()
    assert len(default) == 240 and {t.level for t in default} == {1, 2, 3}
    both = generate_tasks(levels=ALL_LEVELS)
    assert [t.to_dict() for t in both if t.level > 0] == [t.to_dict() for t in default]


@pytest.mark.parametrize("task", LEVEL0, ids=lambda t: t.task_id)
def test_the_named_command_prints_the_answer_and_the_oracle_passes(task):
    command = COMMAND.search(task.instruction)[1]
    assert task.solution == [command, f"submit {task.check['expected']}"]
    assert run_named(command, task.tree) == task.check["expected"]
    submitted = task.solution[-1].removeprefix("submit ")
    assert verify(task, submitted, None).passed
    assert not verify(task, None, None).passed  # doing nothing: no submission
    assert not verify(task, "", None).passed
    assert task.check["expected"] not in task.instruction or len(task.check["expected"]) <= 3


def test_level_0_held_out_tasks_are_never_in_a_training_batch(tmp_path):
    held_out = batches.terminal_held_out_tasks()
    assert {t.level for t in held_out} == {0, 1, 2, 3} and len(held_out) == 120
    held0 = [t for t in held_out if t.level == 0]
    assert [t.task_id for t in held0] == [t.task_id for t in LEVEL0[:30]]
    prints = {batches.terminal_fingerprint(t) for t in held0}
    for seed in (0, 1, 7):
        train = batches.terminal_training_tasks(seed, 60, (0,))
        assert all(t.level == 0 and t.split == "train" and batches.terminal_fingerprint(t) not in prints for t in train)
        assert not {t.task_id for t in train} & {t.task_id for t in held0}
    bid = batches.register_terminal_batch(tmp_path, seed=0, num_tasks=50, levels=(0,), max_turns=4)
    assert bid == "terminal-s0-n50-l0"
    rows = batches.load_batch(tmp_path, bid, datetime.now(timezone.utc)).tasks
    assert len(rows) == 50 and {r["difficulty"] for r in rows} == {0}
    assert not {r["task_id"] for r in rows} & {t.task_id for t in held0}
    assert min(int(r["task_id"].split("-")[3]) for r in rows) == 30


def test_levels_parsing_takes_0_for_terminal_only():
    import typer

    from tentalis_pipelines.cli.common import parse_levels

    assert parse_levels("0", "terminal") == [0] and parse_levels("0,1", "terminal") == [0, 1]
    assert parse_levels("1,2") == [1, 2]
    for bad, tasks in (("0", "arithmetic"), ("4", "terminal"), ("x", "terminal")):
        with pytest.raises(typer.Exit):
            parse_levels(bad, tasks)


def test_a_repeated_command_gets_the_notice_to_submit_its_output():
    from tentalis_pipelines.envs.terminal import REPEAT_NOTICE, TerminalConfig, repeat_notice

    assert repeat_notice("wc -l < a.txt", "wc -l < a.txt ") == "\n" + REPEAT_NOTICE
    assert repeat_notice("wc -l < a.txt", None) == "" and repeat_notice("wc -l < a.txt", "ls") == ""
    assert TerminalConfig().repeat_notice is False  # opt-in: the default environment is unchanged


def test_each_level_has_its_own_held_out_benchmark_and_turn_limit():
    from tentalis_pipelines.evaluation.benchmarks import BENCHMARKS, DEFAULT_LIMITS, load_benchmark
    from tentalis_pipelines.tasks.batches import terminal_max_turns

    _, everything = load_benchmark("terminal")
    for level in (0, 1, 2, 3):
        name = f"terminal-l{level}"
        assert name in BENCHMARKS and DEFAULT_LIMITS[name] == 30
        got_name, items = load_benchmark(name)
        assert got_name == name and len(items) == 30 and {it.extra["level"] for it in items} == {level}
        # the same items as that level's part of the whole benchmark, not a new draw
        assert [it.item_id for it in items] == [it.item_id for it in everything if it.extra["level"] == level]
    assert terminal_max_turns((0,)) == 4 and terminal_max_turns((0, 0)) == 4
    assert terminal_max_turns((0, 1)) == 8 and terminal_max_turns((2,)) == 8


def test_a_learning_run_is_gated_on_the_levels_it_trains_at_the_recipe_temperature():
    import typer

    from tentalis_pipelines.cli.cycle import check_temperature, held_out_benchmark
    from tentalis_pipelines.tasks.families import get_family

    assert held_out_benchmark("terminal", (0,)) == "terminal-l0" and held_out_benchmark("terminal", (3,)) == "terminal-l3"
    assert held_out_benchmark("terminal", (0, 1)) == "terminal" and held_out_benchmark("gsm8k", (1,)) == "gsm8k"
    assert get_family("terminal").recipe((0,)).temperature == 0.4 and get_family("arithmetic").recipe((1,)).temperature is None
    assert check_temperature(None) is None and check_temperature(0.7) == 0.7 and check_temperature(2.0) == 2.0
    for bad in (0.0, -0.1, 2.5):
        with pytest.raises(typer.Exit):
            check_temperature(bad)
