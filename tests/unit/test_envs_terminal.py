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
from tentalis_pipelines.sandbox import ShellResult


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
    from tentalis_pipelines.sandbox import SandboxUnavailableError

    def unavailable(*args, **kwargs):
        raise SandboxUnavailableError("the code sandbox needs root")

    monkeypatch.setattr(terminal, "ShellSession", unavailable)
    with pytest.raises(EnvironmentUnavailable, match="needs root"):
        run_episode(TerminalEnv(), ANSWER_TASK, oracle_agent(ANSWER_TASK))


# --------------------------------------------------------------------------- episodes on a scripted sandbox
# The real sandbox needs root and subprocesses (tests/test_envs_terminal_integration.py); these drive
# TerminalEnv's own contract (turns, ends, verdicts, what reaches the observation) on a stand-in session
# that answers each command with a scripted ShellResult.
class ScriptedSession:
    """Stands in for ShellSession: records what the environment asks of it, answers from ``results``
    (then: ``submit ...`` submits its arguments, anything else prints nothing and exits 0)."""

    instances: list[ScriptedSession] = []
    results: list[ShellResult] = []
    tree: dict[str, dict] | None = None
    snapshot_error: Exception | None = None

    def __init__(self, files, limits=None, *, hide_dirs=None, env=None):
        self.files, self.limits, self.hide_dirs, self.env = files, limits, hide_dirs, env
        self.uid = 4242 + len(ScriptedSession.instances)
        self.memory_limit = {"kind": "cgroup-v2", "bytes": 512 << 20}
        self.commands: list[str] = []
        self.snapshots: list[tuple[str, ...]] = []
        self.closed = 0
        self.alive = True
        self.queue = list(ScriptedSession.results)
        ScriptedSession.instances.append(self)

    def run(self, command):
        self.commands.append(command)
        if self.queue:
            return self.queue.pop(0)
        if command.split(" ", 1)[0] == "submit":  # what the exported function does: the arguments, on the channel
            return ok(submitted=True, submission=command[len("submit "):])
        return ok()

    def snapshot(self, first=()):
        self.snapshots.append(tuple(first))
        if ScriptedSession.snapshot_error is not None:
            raise ScriptedSession.snapshot_error
        return dict(ScriptedSession.tree or {})

    def close(self):
        self.closed += 1
        self.alive = False


def ok(head: str = "", code: int = 0, **flags) -> ShellResult:
    return ShellResult(exit_code=code, head=head, tail="", output_bytes=len(head), omitted_bytes=0, seconds=0.25, **flags)


@pytest.fixture
def scripted(monkeypatch):
    from tentalis_pipelines.envs import terminal

    ScriptedSession.instances, ScriptedSession.results = [], []
    ScriptedSession.tree, ScriptedSession.snapshot_error = None, None
    monkeypatch.setattr(terminal, "ShellSession", ScriptedSession)
    return ScriptedSession


def bash(command: str) -> str:
    return f"```bash\n{command}\n```"


def test_reset_opens_with_system_prompt_worked_example_and_task_in_a_fresh_sandbox(scripted):
    from tentalis_pipelines.envs.terminal import DEMONSTRATION, SYSTEM_PROMPT, TerminalConfig

    env = TerminalEnv(hide_dirs=["/secret"])
    obs = env.reset(ANSWER_TASK)
    (session,) = scripted.instances
    assert session.files == ANSWER_TASK.tree and session.limits == env.config.limits and session.hide_dirs == ["/secret"]
    assert session.env == {"BASH_FUNC_submit%%": submit_function()}
    assert env.sandbox_uid == session.uid and env.max_turns == 8
    assert obs.messages[0] == {"role": "system", "content": SYSTEM_PROMPT, "kind": "system"}
    assert obs.messages[1:5] == [{**m, "kind": "demonstration"} for m in DEMONSTRATION]
    assert obs.messages[5:] == [{"role": "user", "content": ANSWER_TASK.instruction, "kind": "instruction"}]
    bare = TerminalEnv(TerminalConfig(demonstration=False, system_prompt="be brief", max_turns=3))
    assert [m["content"] for m in bare.reset(ANSWER_TASK.to_dict()).messages] == ["be brief", ANSWER_TASK.instruction]
    assert bare.max_turns == 3 and bare.task == ANSWER_TASK  # a task's dict is read as the task
    # a second reset closes the first episode's sandbox and starts a fresh one with a fresh state
    env.step(bash("ls"))
    env.reset(ANSWER_TASK)
    assert session.closed == 1 and env.turn == 0 and env.session is scripted.instances[-1] and len(scripted.instances) == 3


def test_a_submission_ends_the_episode_with_its_sanitised_answer_and_the_verdict(scripted):
    scripted.results = [ok("2\n"), ok(submitted=True, submission=" \x1b[1m2\x1b[0m\x00\n")]
    env = TerminalEnv()
    env.reset(ANSWER_TASK)
    first = env.step(bash("wc -l < a.txt"))
    assert not first.done and first.reward == 0.0 and "end_reason" not in first.info
    assert first.observation.messages == [{"role": "user", "content": "2\n[exit code 0]", "kind": "observation"}]
    assert first.info["command"] == "wc -l < a.txt" and first.info["turn"] == 1
    assert (first.info["exit_code"], first.info["timed_out"], first.info["output_bytes"]) == (0, False, 2)
    assert (first.info["memory_limit_kind"], first.info["memory_limit_bytes"]) == ("cgroup-v2", 512 << 20)
    assert first.info["command_seconds"] == 0.25 and 0 <= first.info["env_seconds"] < 5  # a duration, not a clock reading
    assert (first.info["process_limit"], first.info["killed_processes"], first.info["memory_limit"],
            first.info["network_attempts"]) == (False, 0, False, 0)
    last = env.step(bash("submit 2"))
    assert last.done and last.reward == 1.0 and env.answer == "2" and last.info["answer"] == "2"
    assert (last.info["end_reason"], last.info["passed"], last.info["detail"]) == ("submitted", True, "correct answer")
    session = scripted.instances[0]
    assert session.commands == ["wc -l < a.txt", "submit 2"] and session.closed == 1 and env.session is None
    assert session.snapshots == []  # an answer task's verdict needs no tree
    with pytest.raises(RuntimeError, match=r"^step\(\) after the episode ended \(or before reset\)$"):
        env.step(bash("ls"))


def test_a_wrong_submission_scores_zero_and_step_before_reset_is_refused(scripted):
    scripted.results = [ok(submitted=True, submission="3")]
    env = TerminalEnv()
    with pytest.raises(RuntimeError, match=r"^step\(\) after the episode ended \(or before reset\)$"):
        env.step(bash("ls"))
    with pytest.raises(RuntimeError, match=r"^verify\(\) before reset\(\)$"):
        env.verify()
    env.reset(ANSWER_TASK)
    res = env.step(bash("submit 3"))
    assert res.done and res.reward == 0.0 and not res.info["passed"] and env.end_reason == "submitted"


def test_format_errors_run_nothing_count_as_turns_and_the_limit_is_hit_exactly(scripted):
    from tentalis_pipelines.envs.terminal import TerminalConfig, format_error_message

    env = TerminalEnv(TerminalConfig(max_turns=2))
    env.reset(ANSWER_TASK)
    res = env.step("I think the answer is 2.")
    assert not res.done and res.info == {"turn": 1, "format_error": "no bash code block found",
                                         "env_seconds": res.info["env_seconds"]}
    assert res.observation.messages == [{"role": "user", "kind": "format_error",
                                         "content": format_error_message("no bash code block found")}]
    assert scripted.instances[0].commands == []
    res = env.step(bash("ls") + bash("pwd"))
    assert res.done and res.info["end_reason"] == "turn_limit" and res.reward == 0.0
    assert res.info["detail"] == "no answer was submitted" and res.info["format_error"] == "2 bash code blocks found"
    assert scripted.instances[0].closed == 1


def test_the_turn_limit_counts_commands_too(scripted):
    from tentalis_pipelines.envs.terminal import TerminalConfig

    env = TerminalEnv(TerminalConfig(max_turns=1))
    env.reset(ANSWER_TASK)
    res = env.step(bash("ls"))
    assert res.done and env.end_reason == "turn_limit" and res.info["turn"] == 1


def test_a_sandbox_signal_ends_the_episode_as_hostile_unless_told_not_to(scripted):
    from tentalis_pipelines.envs.terminal import TerminalConfig

    scripted.results = [ok("boom", code=137, process_limit=True)]
    env = TerminalEnv()
    env.reset(ANSWER_TASK)
    res = env.step(bash(":(){ :|:& };:"))
    text = res.observation.messages[0]["content"]
    assert text.endswith("[killed: the command ran into the process limit]\n[episode ended: process limit reached (fork bomb?)]")
    assert res.done and res.reward == 0.0 and env.end_reason == "hostile: process limit reached (fork bomb?)"
    assert env.verify() == Verdict(False, 0.0, "hostile: process limit reached (fork bomb?)")
    # a hostile end scores 0 even when the answer would have been right
    scripted.results = [ok(network_attempts=3, submitted=True, submission="2")]
    env.reset(ANSWER_TASK)
    res = env.step(bash("curl x; submit 2"))
    assert res.done and env.end_reason == "hostile: network access" and res.reward == 0.0 and env.answer is None
    # end_on_violation off: the episode goes on (and a submission in the same command counts)
    scripted.results = [ok(memory_limit=True), ok(network_attempts=1, submitted=True, submission="2")]
    lenient = TerminalEnv(TerminalConfig(end_on_violation=False))
    lenient.reset(ANSWER_TASK)
    res = lenient.step(bash("python -c 'x = bytearray(10**10)'"))
    assert not res.done and "[episode ended" not in res.observation.messages[0]["content"]
    assert res.info["memory_limit"] is True
    res = lenient.step(bash("submit 2"))
    assert res.done and lenient.end_reason == "submitted" and res.reward == 1.0


def test_a_failed_sandbox_is_an_environment_error_not_the_agents_failure(scripted):
    scripted.results = [ShellResult(None, "", "", 0, 0, 0.0, error="server died")]
    env = TerminalEnv()
    env.reset(FILES_TASK)
    res = env.step(bash("echo hi > b.txt"))
    assert res.observation.messages[0]["content"] == "The environment failed: server died"
    assert res.done and res.reward == 0.0 and env.end_reason == "error: sandbox: server died"
    assert env.verify() == Verdict(False, 0.0, "error: sandbox: server died")


def test_an_edit_task_is_judged_on_the_final_tree_read_first_for_the_checked_files(scripted):
    task = TerminalTask(task_id="t-two", level=3, family="test", instruction="Make b.txt and c.txt.",
                        tree={"a.txt": "x\n"}, check={"kind": "tree", "rules": [
                            {"path": "b.txt", "file": "hi"}, {"path": "d", "dir": True}, {"path": "c.txt", "file": "yo"},
                            {"path": "gone", "absent": True}]}, solution=["submit"])
    scripted.tree = {"a.txt": _f("x\n"), "b.txt": _f("hi\n"), "c.txt": _f("yo"), "d": {"type": "dir"}}
    env = TerminalEnv()
    env.reset(task)
    probe = env.verify()  # before the end: a probe of the tree as it is
    assert probe.passed and scripted.instances[0].snapshots == [()]
    res = env.step(bash("submit"))
    assert res.done and res.reward == 1.0 and res.info["passed"] and env.end_reason == "submitted"
    assert scripted.instances[0].snapshots[-1] == ("b.txt", "c.txt")  # the checked files, in the rules' order
    assert env.session is None and scripted.instances[0].closed == 1
    scripted.tree = {"b.txt": _f("hi")}
    env.reset(task)
    assert env.step(bash("submit")).info["detail"] == "d should be a directory"
    # the verdict is decided once: a changed tree afterwards changes nothing
    scripted.tree = None
    assert env.verify().detail == "d should be a directory"


def test_an_edit_task_is_checked_without_submit_and_an_unreadable_tree_is_an_error(scripted):
    from tentalis_pipelines.envs.terminal import TerminalConfig

    scripted.tree = {"a.txt": _f("one\ntwo\n"), "b.txt": _f("hi")}
    env = TerminalEnv(TerminalConfig(max_turns=1))
    env.reset(FILES_TASK)
    res = env.step(bash("echo hi > b.txt"))
    assert res.done and env.end_reason == "turn_limit" and res.reward == 1.0  # the final state is what counts
    scripted.snapshot_error = OSError("tree too deep")
    env.reset(FILES_TASK)
    res = env.step(bash("echo hi > b.txt"))
    assert res.done and res.reward == 0.0
    assert env.end_reason == "error: the final tree could not be read: tree too deep"
    assert scripted.instances[-1].closed == 1


def test_an_answer_task_probe_reads_no_tree_and_a_dead_session_is_not_snapshotted(scripted):
    env = TerminalEnv()
    env.reset(ANSWER_TASK)
    assert env.verify() == Verdict(False, 0.0, "no answer was submitted")
    assert scripted.instances[0].snapshots == []
    env.reset(FILES_TASK)
    env.session.alive = False  # the sandbox died under the episode
    res = env.step(bash("submit"))
    assert res.done and scripted.instances[-1].snapshots == [] and res.info["detail"] == "the final tree could not be read"


def test_the_repeat_notice_follows_a_repeated_command_only_when_asked_for(scripted):
    from tentalis_pipelines.envs.terminal import REPEAT_NOTICE, TerminalConfig

    env = TerminalEnv(TerminalConfig(repeat_notice=True))
    env.reset(ANSWER_TASK)
    contents = [env.step(bash(c)).observation.messages[0]["content"] for c in ("wc -l < a.txt", "wc -l < a.txt", "ls")]
    assert [c.endswith(REPEAT_NOTICE) for c in contents] == [False, True, False]
    assert contents[1] == "(no output)\n[exit code 0]\n" + REPEAT_NOTICE
    # a format error between two equal commands does not reset what the last command was
    env.reset(ANSWER_TASK)
    env.step(bash("cat a.txt"))
    env.step("no block")
    assert env.step(bash("cat a.txt")).observation.messages[0]["content"].endswith(REPEAT_NOTICE)
    plain = TerminalEnv()
    plain.reset(ANSWER_TASK)
    plain.step(bash("ls"))
    assert REPEAT_NOTICE not in plain.step(bash("ls")).observation.messages[0]["content"]


def test_close_ends_the_sandbox_once(scripted):
    env = TerminalEnv()
    env.close()  # nothing to close yet
    env.reset(ANSWER_TASK)
    env.close()
    env.close()
    assert scripted.instances[0].closed == 1 and env.session is None


def test_observation_keeps_trailing_spaces_and_names_each_kill_exactly():
    assert format_observation(ok("x  \n\n"), limit=100, timeout_s=5) == "x  \n[exit code 0]"
    assert format_observation(result_with("boXX\n"), limit=100, timeout_s=5) == "boXX\n[exit code 1]"
    both = result_with("", process_limit=True, memory_limit=True, killed_processes=3)
    assert format_observation(both, limit=100, timeout_s=5) == (
        "(no output)\n[exit code 1]\n[killed: the command ran into the process limit]")
    mem = result_with("", memory_limit=True, killed_processes=3)
    assert format_observation(mem, limit=100, timeout_s=5).endswith("\n[killed: the command ran into the episode's memory limit]")
    left = result_with("", killed_processes=2)
    assert format_observation(left, limit=100, timeout_s=2.5).endswith("\n[2 process(es) it left running were killed]")
    slow = result_with("", timed_out=True)
    assert format_observation(slow, limit=100, timeout_s=2.5) == "(no output)\n[killed: the command ran past the 2.5 s time limit]"


def test_the_format_message_shows_the_expected_form_and_how_to_finish():
    from tentalis_pipelines.envs.terminal import format_error_message

    assert format_error_message("no bash code block found") == (
        "Format error: no bash code block found. Reply with exactly one bash code block holding one command, like\n"
        "```bash\nls\n```\nTo finish, run submit ANSWER (or submit on its own after changing files).")


def test_truncation_splits_an_odd_limit_and_handles_the_smallest_limits():
    assert truncate_middle("abcdefgh", 5) == "ab\n[... 3 characters truncated ...]\nfgh"
    assert truncate_output("ab", "cd", 1, 40) == "ab\n[... 1 characters truncated ...]\ncd"  # one byte dropped is a cut
    assert truncate_output("abc", "xyz", 10, 2) == "a\n[... 14 characters truncated ...]\nz"
    assert truncate_output("abc", "xyz", 10, 1) == "\n[... 15 characters truncated ...]\nz"
    assert truncate_output("abc", "xyz", 10, 0) == "\n[... 16 characters truncated ...]\n"


def test_a_new_episode_starts_with_nothing_decided(scripted):
    env = TerminalEnv()
    assert env.task is None and env.session is None and env.sandbox_uid is None and env.hide_dirs is None
    assert (env.turn, env.done, env.answer, env.end_reason) == (0, False, None, "")
    for _ in range(2):  # the first episode, then one after a finished episode
        env.reset(ANSWER_TASK)
        assert (env.turn, env.done, env.answer, env.end_reason) == (0, False, None, "")
        env.step(bash("submit 2"))
        assert env.done is True and env.answer == "2" and env.end_reason == "submitted"


def test_every_sandbox_signal_reaches_the_step_info_and_a_timeout_is_named_with_the_limit(scripted):
    from tentalis_pipelines.envs.terminal import TerminalConfig
    from tentalis_pipelines.sandbox import ShellLimits

    scripted.results = [ok(killed_processes=2, network_attempts=3, memory_limit=True, process_limit=True),
                        ok(code=137, timed_out=True)]
    env = TerminalEnv(TerminalConfig(end_on_violation=False, limits=ShellLimits(command_timeout_s=2.5)))
    env.reset(ANSWER_TASK)
    info = env.step(bash("x")).info
    assert (info["process_limit"], info["killed_processes"], info["memory_limit"], info["network_attempts"]) == (True, 2, True, 3)
    res = env.step(bash("sleep 100"))
    assert res.observation.messages[0]["content"] == "(no output)\n[killed: the command ran past the 2.5 s time limit]"
    assert res.info["timed_out"] is True and res.info["exit_code"] == 137
