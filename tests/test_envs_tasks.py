"""Every generated terminal task is solvable (its oracle passes) and can be failed (doing nothing fails),
both through the real sandbox."""

from __future__ import annotations

import os
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import pytest

from tentalis_pipelines.envs.agents import do_nothing_agent, oracle_agent
from tentalis_pipelines.envs.base import SUBMITTED
from tentalis_pipelines.envs.runner import run_episode
from tentalis_pipelines.envs.terminal import TerminalEnv
from tentalis_pipelines.envs.terminal_tasks import ALL_LEVELS, FAMILIES, generate_tasks
from tentalis_pipelines.tasks.batches import terminal_kind_held_out_tasks, terminal_paraphrased_tasks

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux") or os.geteuid() != 0,
                                reason="the sandbox needs Linux namespaces and root (CI runs as root)")

TASKS = generate_tasks(levels=ALL_LEVELS)  # level 0 (opt-in) too
# the paraphrased held-out set (other words, other files) and a few of each kind's held-out set
EXTRA = [*terminal_paraphrased_tasks(1), *(terminal_kind_held_out_tasks(1, kind, 3) for kind in FAMILIES[1])]


def _both(task):
    solved = run_episode(TerminalEnv(), task, oracle_agent(task))
    idle = run_episode(TerminalEnv(), task, do_nothing_agent())
    return task, solved, idle


def test_every_task_is_solved_by_its_oracle_and_failed_by_doing_nothing():
    assert len(TASKS) >= 280
    extra = [t for group in EXTRA for t in (group if isinstance(group, list) else [group])]
    assert len(extra) == 30 + 3 * len(FAMILIES[1])
    unsolved, passed_idle = [], []
    with ThreadPoolExecutor(2) as pool:
        for task, solved, idle in pool.map(_both, [*TASKS, *extra]):
            if not (solved.passed and solved.end_reason == SUBMITTED and solved.reward == 1.0
                    and solved.turns_used == len(task.solution)):
                unsolved.append((task.task_id, solved.end_reason, solved.verdict.detail))
            if idle.passed or idle.reward != 0.0:
                passed_idle.append(task.task_id)
    assert unsolved == []
    assert passed_idle == []


def test_level_0_is_solved_in_one_turn_by_submitting_the_named_commands_output():
    """``submit $(command)``: the one-turn solution a level-0 instruction invites."""
    failed = []
    for task in [t for t in TASKS if t.level == 0]:
        command = task.instruction.split("`")[1]
        ep = run_episode(TerminalEnv(), task, oracle_agent(replace(task, solution=[f"submit $({command})"])))
        if not (ep.passed and ep.turns_used == 1):
            failed.append((task.task_id, ep.end_reason, ep.verdict.detail))
    assert failed == []


def test_the_repeat_notice_follows_a_repeated_command_only_when_asked_for():
    from tentalis_pipelines.envs.agents import scripted_agent
    from tentalis_pipelines.envs.terminal import REPEAT_NOTICE, TerminalConfig

    task = next(t for t in TASKS if t.family == "run_cat")
    for on in (True, False):
        ep = run_episode(TerminalEnv(TerminalConfig(max_turns=4, repeat_notice=on)), task,
                         scripted_agent(["cat readme.txt", "cat readme.txt", "ls"]))
        shown = [m["content"] for m in ep.messages if m.get("kind") == "observation"]
        assert [REPEAT_NOTICE in s for s in shown[:3]] == [False, on, False]
