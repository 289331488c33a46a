"""The terminal environment in the real sandbox: files persist, submissions, format errors, the turn limit,
rewards, truncated output, limits (the pure parts are in tests/unit/test_envs_terminal.py)."""

from __future__ import annotations

import json
import os
import sys

import pytest

from tentalis_pipelines.envs.agents import oracle_agent, raw_agent, scripted_agent
from tentalis_pipelines.envs.base import SUBMITTED, TURN_LIMIT, Episode
from tentalis_pipelines.envs.runner import run_episode
from tentalis_pipelines.envs.terminal import TerminalConfig, TerminalEnv
from tentalis_pipelines.envs.terminal_tasks import TerminalTask
from tentalis_pipelines.sandbox import ShellLimits

needs_sandbox = pytest.mark.skipif(not sys.platform.startswith("linux") or os.geteuid() != 0,
                                   reason="the sandbox needs Linux namespaces and root (CI runs as root)")

FILES_TASK = TerminalTask(task_id="t-files", level=3, family="test", instruction="Make b.txt hold hi.",
                          tree={"a.txt": "one\ntwo\n"}, check={"kind": "tree", "rules": [{"path": "b.txt", "file": "hi"}]},
                          solution=["echo hi > b.txt", "submit"])
ANSWER_TASK = TerminalTask(task_id="t-answer", level=1, family="test", instruction="How many lines in a.txt?",
                           tree={"a.txt": "one\ntwo\n"}, check={"kind": "answer", "expected": "2"},
                           solution=["wc -l < a.txt", "submit 2"])


@needs_sandbox
def test_files_persist_between_commands_and_the_final_tree_is_checked():
    ep = run_episode(TerminalEnv(), FILES_TASK, scripted_agent(["echo hi > tmp.txt", "mv tmp.txt b.txt", "cat b.txt"]))
    assert [t.observation for t in ep.turns[:3]] == ["(no output)\n[exit code 0]", "(no output)\n[exit code 0]",
                                                     "hi\n[exit code 0]"]
    assert ep.end_reason == SUBMITTED and ep.passed and ep.reward == 1.0 and ep.turns_used == 4


@needs_sandbox
def test_submit_with_command_substitution_answers_in_one_turn():
    ep = run_episode(TerminalEnv(), ANSWER_TASK, scripted_agent(["submit $(wc -l < a.txt)"]))
    assert ep.end_reason == SUBMITTED and ep.passed and ep.turns_used == 1
    assert ep.turns[0].info["answer"] == "2"
    wrong = run_episode(TerminalEnv(), ANSWER_TASK, scripted_agent(["submit $(wc -l a.txt)"]))  # "2 a.txt"
    assert wrong.end_reason == SUBMITTED and not wrong.passed and wrong.reward == 0.0
    spaced = run_episode(TerminalEnv(), ANSWER_TASK, scripted_agent(["submit '  2 '"]))
    assert spaced.turns[0].info["answer"] == "2" and spaced.passed  # the answer is stripped
    piped = run_episode(TerminalEnv(), ANSWER_TASK, scripted_agent(["echo before; wc -l < a.txt | (read n; submit $n)"]))
    assert piped.turns[0].info["answer"] == "2" and piped.passed  # from a subshell too
    assert piped.turns[0].observation == "before\n[exit code 0]"  # the submission is not in the output


@needs_sandbox
def test_format_errors_run_nothing_and_count_as_turns_up_to_the_limit():
    env = TerminalEnv(TerminalConfig(max_turns=3))
    ep = run_episode(env, FILES_TASK, raw_agent(["I would write b.txt.", "```bash\necho hi > b.txt\n```\n```bash\nls\n```"]))
    assert ep.end_reason == TURN_LIMIT and ep.turns_used == 3
    assert all(t.action is None and t.observation.startswith("Format error") for t in ep.turns)
    assert "2 bash code blocks" in ep.turns[1].observation
    assert not ep.passed  # nothing ran: b.txt was never written


@needs_sandbox
def test_turn_limit_ends_the_episode_and_an_edit_is_still_checked():
    env = TerminalEnv(TerminalConfig(max_turns=2))
    ep = run_episode(env, FILES_TASK, scripted_agent(["echo hi > b.txt", "ls", "ls", "ls"]))
    assert ep.end_reason == TURN_LIMIT and ep.turns_used == 2 and ep.passed
    unanswered = run_episode(env, ANSWER_TASK, scripted_agent(["wc -l < a.txt", "wc -l < a.txt"]))
    assert unanswered.end_reason == TURN_LIMIT and not unanswered.passed


@needs_sandbox
def test_only_the_last_step_carries_the_reward():
    env = TerminalEnv()
    env.reset(ANSWER_TASK)
    first = env.step("```bash\nwc -l < a.txt\n```")
    assert (first.reward, first.done) == (0.0, False)
    assert first.observation.messages[0]["content"] == "2\n[exit code 0]"
    last = env.step("```bash\nsubmit 2\n```")
    assert (last.reward, last.done, last.info["end_reason"]) == (1.0, True, SUBMITTED)
    with pytest.raises(RuntimeError):
        env.step("```bash\nls\n```")
    env.close()


@needs_sandbox
def test_long_output_is_truncated_with_a_marker():
    env = TerminalEnv(TerminalConfig(observation_chars=200))
    ep = run_episode(env, ANSWER_TASK, scripted_agent(["seq 1 100000", "submit 2"]))
    obs = ep.turns[0].observation
    assert obs.startswith("1\n2\n3\n") and "100000\n[exit code 0]" in obs
    assert "characters truncated ...]" in obs and len(obs) < 320


@needs_sandbox
def test_episode_is_json_both_ways():
    ep = run_episode(TerminalEnv(), ANSWER_TASK, oracle_agent(ANSWER_TASK))
    d = json.loads(json.dumps(ep.to_dict()))
    assert d["turns_used"] == 2 and d["verdict"]["passed"] is True
    assert Episode.from_dict(d) == ep
    kinds = [m["kind"] for m in ep.messages]
    assert kinds[0] == "system" and "instruction" in kinds and kinds.count("assistant") == 2


@needs_sandbox
def test_the_sandbox_limits_reach_the_commands():
    env = TerminalEnv(TerminalConfig(limits=ShellLimits(command_timeout_s=3, max_file_mb=1, disk_mb=4)))
    ep = run_episode(env, ANSWER_TASK, scripted_agent([
        "head -c 2000000 /dev/zero > big; ls -l big | awk '{print $5}'",
        "id -u; echo $HOME; pwd", "submit 2"]))
    assert "File size limit exceeded" in ep.turns[0].observation or "1048576" in ep.turns[0].observation
    uid, home, pwd = ep.turns[1].observation.splitlines()[:3]
    assert int(uid) >= 3_100_000 and home == pwd
