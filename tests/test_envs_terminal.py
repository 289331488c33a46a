"""The terminal environment: action parsing, observations, checks, tasks, and episodes in the real sandbox."""

from __future__ import annotations

import json
import os
import sys

import pytest

from tentalis_pipelines.envs.agents import oracle_agent, raw_agent, scripted_agent
from tentalis_pipelines.envs.base import SUBMITTED, TURN_LIMIT, Episode, Verdict
from tentalis_pipelines.envs.runner import run_episode
from tentalis_pipelines.envs.terminal import (
    TerminalConfig,
    TerminalEnv,
    format_observation,
    parse_action,
    split_submission,
    truncate_middle,
    truncate_output,
)
from tentalis_pipelines.envs.terminal_tasks import (
    FAMILIES,
    TerminalTask,
    check_answer,
    check_tree,
    generate_tasks,
    make_task,
    split_counts,
    verify,
)
from tentalis_pipelines.evaluation.sandbox import ShellLimits, ShellResult

needs_sandbox = pytest.mark.skipif(not sys.platform.startswith("linux") or os.geteuid() != 0,
                                   reason="the sandbox needs Linux namespaces and root (CI runs as root)")


# --------------------------------------------------------------------------- action parsing
def test_one_bash_block_is_the_command():
    assert parse_action("Let me count.\n```bash\nwc -l < a.txt\n```\nDone.") == ("wc -l < a.txt", "")
    assert parse_action("```sh\nls -la\n```") == ("ls -la", "")
    assert parse_action("```bash\ncd d\nls\n```") == ("cd d\nls", "")


def test_no_block_several_blocks_or_an_empty_one_is_a_format_error():
    assert parse_action("The answer is 42.") == (None, "no bash code block found")
    assert parse_action("```python\nprint(1)\n```")[0] is None
    cmd, why = parse_action("```bash\nls\n```\n```bash\npwd\n```")
    assert cmd is None and "2 bash code blocks" in why
    assert parse_action("```bash\n\n```") == (None, "the bash code block is empty")
    assert parse_action("```bash\nls")[0] is None  # never closed


# --------------------------------------------------------------------------- observations
def test_truncation_keeps_head_and_tail_and_says_how_much_is_missing():
    text = "".join(f"line {i}\n" for i in range(10_000))
    out = truncate_middle(text, 1000)
    assert out.startswith("line 0\nline 1\n") and out.endswith("line 9999\n")
    cut = len(text) - 1000
    assert f"[... {cut:,} characters truncated ...]" in out
    assert len(out) <= 1000 + 60
    assert truncate_middle("short", 1000) == "short"
    assert truncate_middle("x" * 1000, 1000) == "x" * 1000
    assert "truncated" in truncate_middle("x" * 1001, 1000)


def test_truncation_counts_what_the_sandbox_already_dropped():
    out = truncate_output("a" * 50, "b" * 50, 1_000_000, 40)
    assert out == "a" * 20 + "\n[... 1,000,060 characters truncated ...]\n" + "b" * 20
    assert truncate_output("abc", "", 0, 40) == "abc"


def test_observation_has_output_and_exit_code_and_says_why_a_command_was_killed():
    res = ShellResult(exit_code=2, head="oops\n", tail="", output_bytes=5, omitted_bytes=0, seconds=0.1)
    assert format_observation(res, limit=100, timeout_s=5) == "oops\n[exit code 2]"
    quiet = ShellResult(exit_code=0, head="", tail="", output_bytes=0, omitted_bytes=0, seconds=0.1)
    assert format_observation(quiet, limit=100, timeout_s=5) == "(no output)\n[exit code 0]"
    slow = ShellResult(exit_code=137, head="", tail="", output_bytes=0, omitted_bytes=0, seconds=5, timed_out=True)
    assert "killed: the command ran past the 5 s time limit" in format_observation(slow, limit=100, timeout_s=5)


def test_submission_is_read_after_the_marker():
    assert split_submission("hello\n@@M@@ 42 \n", "@@M@@") == (True, "42", "hello")
    assert split_submission("no marker here", "@@M@@") == (False, "", "no marker here")


# --------------------------------------------------------------------------- checks
def test_answer_check_is_exact_after_strip():
    check = {"kind": "answer", "expected": "alice 42 Lisbon"}
    assert check_answer(check, "  alice 42 Lisbon\n") == Verdict(True, 1.0, "correct answer")
    assert not check_answer(check, "alice 42 lisbon").passed
    assert not check_answer(check, "alice 42").passed
    assert not check_answer(check, None).passed
    assert check_answer({"kind": "answer", "expected": "7"}, "7").reward == 1.0


def _f(text: str) -> dict:
    return {"type": "file", "text": text}


def test_tree_rules():
    tree = {"a.txt": _f("x\n"), "d": {"type": "dir"}, "d/b.md": _f("y"), "d/c.md": _f("z")}
    ok = {"kind": "tree", "rules": [{"path": "a.txt", "file": "x"}, {"path": "d", "dir": True},
                                    {"path": "d", "entries": ["b.md", "c.md"]}, {"path": "gone.txt", "absent": True}]}
    assert check_tree(ok, tree).passed
    for rule in ({"path": "a.txt", "file": "y"}, {"path": "a.txt", "absent": True}, {"path": "a.txt", "dir": True},
                 {"path": "d", "entries": ["b.md"]}, {"path": "d", "entries": ["b.md", "c.md", "e.md"]},
                 {"path": "missing.txt", "file": "x"}, {"path": "d", "file": "x"}):
        assert not check_tree({"kind": "tree", "rules": [rule]}, tree).passed, rule
    # a symlink to the right content is not the file
    assert not check_tree({"kind": "tree", "rules": [{"path": "l", "file": "x"}]},
                          {"l": {"type": "symlink", "target": "a.txt"}}).passed


def test_verify_reads_the_answer_or_the_tree_by_task_kind():
    answer_task = make_task(1, 0)
    edit_task = make_task(3, 0)
    assert verify(answer_task, answer_task.check["expected"], None).passed
    assert not verify(answer_task, None, {"x": _f("y")}).passed
    assert not verify(edit_task, "", None).passed  # the tree could not be read: fail, not pass
    initial = {p: _f(t) for p, t in edit_task.tree.items()}
    assert not verify(edit_task, "", initial).passed


# --------------------------------------------------------------------------- tasks
def test_at_least_200_tasks_in_three_levels_with_a_held_out_split():
    tasks = generate_tasks()
    assert len(tasks) >= 200
    counts = split_counts(tasks)
    for level in (1, 2, 3):
        assert counts[(level, "test")] == 30
        assert counts[(level, "train")] >= 50
        assert {t.family for t in tasks if t.level == level} == set(FAMILIES[level])
    assert len({t.task_id for t in tasks}) == len(tasks)
    assert len({(t.instruction, json.dumps(t.tree, sort_keys=True)) for t in tasks}) == len(tasks)
    assert {t.kind for t in tasks if t.level < 3} == {"answer"} and {t.kind for t in tasks if t.level == 3} == {"tree"}


def test_tasks_are_deterministic_and_the_held_out_split_does_not_move():
    assert [t.to_dict() for t in generate_tasks(seed=0)] == [t.to_dict() for t in generate_tasks(seed=0)]
    assert generate_tasks(seed=1)[0].tree != generate_tasks(seed=0)[0].tree
    small = [t for t in generate_tasks(40) if t.split == "test"]
    big = [t for t in generate_tasks(300) if t.split == "test"]
    assert [t.to_dict() for t in small] == [t.to_dict() for t in big]
    assert make_task(2, 17) == generate_tasks()[80 + 17]


def test_tasks_are_json_and_task_rows():
    for t in generate_tasks(12):
        again = TerminalTask.from_dict(json.loads(json.dumps(t.to_dict())))
        assert again == t
        row = t.task_row()
        assert row["prompt"] == t.instruction and json.loads(row["reference"]) == t.check
        assert json.loads(row["metadata"])["level"] == t.level
        assert TerminalTask.from_task_row(json.loads(json.dumps(row))) == t


def test_answers_are_not_in_the_instruction():
    for t in generate_tasks():
        if t.kind == "answer" and len(t.check["expected"]) > 3:
            assert t.check["expected"] not in t.instruction, t.task_id


# --------------------------------------------------------------------------- episodes in the sandbox
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


def test_no_sandbox_is_an_error_for_the_whole_batch_not_a_failed_episode(monkeypatch):
    from tentalis_pipelines.envs import terminal
    from tentalis_pipelines.envs.base import EnvironmentUnavailable
    from tentalis_pipelines.evaluation.sandbox import SandboxUnavailableError

    def unavailable(*args, **kwargs):
        raise SandboxUnavailableError("the code sandbox needs root")

    monkeypatch.setattr(terminal, "ShellSession", unavailable)
    with pytest.raises(EnvironmentUnavailable, match="needs root"):
        run_episode(TerminalEnv(), ANSWER_TASK, oracle_agent(ANSWER_TASK))
