"""The terminal environment without the sandbox: action parsing, observations, checks and the generated tasks
(the episodes in the real sandbox are in tests/test_envs_terminal_integration.py)."""

from __future__ import annotations

import json

import pytest

from tentalis_pipelines.envs.agents import oracle_agent
from tentalis_pipelines.envs.base import Verdict
from tentalis_pipelines.envs.runner import run_episode
from tentalis_pipelines.envs.terminal import (
    TerminalEnv,
    format_observation,
    parse_action,
    sanitize,
    submit_function,
    truncate_middle,
    truncate_output,
    violation,
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
from tentalis_pipelines.evaluation.sandbox import ShellResult


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


def test_submit_writes_to_the_channel_and_holds_no_secret():
    body = submit_function()
    assert ">&3" in body and "@@" not in body
    assert submit_function() == body  # the same in every episode: nothing in it to discover or forge


def result_with(head: str = "", **flags) -> ShellResult:
    return ShellResult(exit_code=1, head=head, tail="", output_bytes=len(head), omitted_bytes=0, seconds=0.1, **flags)


def test_violations_come_from_the_sandbox_signals_never_from_the_output():
    innocent = ("cp: cannot create regular file 'x': Read-only file system\n"
                "fork: retry: Resource temporarily unavailable\nconnect: Network is unreachable\n")
    assert violation(result_with(innocent)) is None
    assert violation(result_with(innocent, network_attempts=0, memory_limit=False)) is None
    assert violation(result_with(process_limit=True)) == "process limit reached (fork bomb?)"
    assert violation(result_with(memory_limit=True)) == "memory limit of the episode reached"
    assert violation(result_with(network_attempts=1)) == "network access"


def test_sanitize_strips_nul_ansi_and_control_characters_but_not_newline_and_tab():
    raw = "a\x00b\x1b[31mred\x1b[0m\tc\nd\x1b]0;title\x07e\x1b(Bf\rg\x7fh\x9b2Ji\x08\x1b"
    assert sanitize(raw) == "abred\tc\ndefghi"
    assert sanitize("") == "" and sanitize("plain\n\ttext") == "plain\n\ttext"
    assert sanitize("caf\u00e9 \u2713") == "caf\u00e9 \u2713"  # printable non-ASCII is kept


def test_observations_are_sanitised_in_head_and_tail():
    res = ShellResult(exit_code=0, head="\x1b[1mbold\x00\n", tail="\x1b[2Kend\r\n", output_bytes=10**6,
                      omitted_bytes=10**6 - 20, seconds=0.1)
    obs = format_observation(res, limit=100, timeout_s=5)
    assert "\x1b" not in obs and "\x00" not in obs and "\r" not in obs
    assert obs.startswith("bold\n") and "end\n[exit code 0]" in obs


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




FILES_TASK = TerminalTask(task_id="t-files", level=3, family="test", instruction="Make b.txt hold hi.",
                          tree={"a.txt": "one\ntwo\n"}, check={"kind": "tree", "rules": [{"path": "b.txt", "file": "hi"}]},
                          solution=["echo hi > b.txt", "submit"])
ANSWER_TASK = TerminalTask(task_id="t-answer", level=1, family="test", instruction="How many lines in a.txt?",
                           tree={"a.txt": "one\ntwo\n"}, check={"kind": "answer", "expected": "2"},
                           solution=["wc -l < a.txt", "submit 2"])


def test_no_sandbox_is_an_error_for_the_whole_batch_not_a_failed_episode(monkeypatch):
    from tentalis_pipelines.envs import terminal
    from tentalis_pipelines.envs.base import EnvironmentUnavailable
    from tentalis_pipelines.evaluation.sandbox import SandboxUnavailableError

    def unavailable(*args, **kwargs):
        raise SandboxUnavailableError("the code sandbox needs root")

    monkeypatch.setattr(terminal, "ShellSession", unavailable)
    with pytest.raises(EnvironmentUnavailable, match="needs root"):
        run_episode(TerminalEnv(), ANSWER_TASK, oracle_agent(ANSWER_TASK))
