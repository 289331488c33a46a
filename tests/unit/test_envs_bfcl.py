"""The BFCL tool-calling family: safe call parsing, BFCL's checker wiring, generated tasks, the guard.

Needs the bfcl-eval wheel (``make install`` puts it in, --no-deps); everything here is pure Python (the
simulators and the checker ship as Python in the wheel): no model, no subprocess.
"""

from __future__ import annotations

import json
import os
import re

import pytest

pytest.importorskip("bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker")

from tentalis_pipelines import contamination  # noqa: E402
from tentalis_pipelines.env_batches import load_tasks, make_env  # noqa: E402
from tentalis_pipelines.envs import bfcl, bfcl_tasks  # noqa: E402
from tentalis_pipelines.envs.base import EnvironmentUnavailable, Verdict  # noqa: E402
from tentalis_pipelines.envs.bfcl import BfclConfig, BfclEnv, CallFormatError, parse_calls  # noqa: E402
from tentalis_pipelines.envs.runner import run_episode  # noqa: E402
from tentalis_pipelines.envs.verdicts import failure_type, verdict_review  # noqa: E402
from tentalis_pipelines.lakehouse import Lakehouse, now_utc  # noqa: E402
from tentalis_pipelines.settings import Paths  # noqa: E402
from tentalis_pipelines.tasks import batches  # noqa: E402

FS_TOOLS = frozenset({"cd", "ls", "mkdir", "touch", "echo", "cat", "mv", "rm", "sort"})


@pytest.fixture(scope="module")
def official():
    return {t.task_id: t for t in bfcl.load_official()}


def _scripted(replies):
    it = iter(replies)
    return lambda messages: next(it)


# ---------------------------------------------------------------------------------- parsing
def test_a_call_list_parses_to_canonical_keyword_calls():
    calls = parse_calls("[cd(folder='docs'), ls(a=True), echo(content=\"it's\", file_name='a.txt')]", FS_TOOLS)
    assert [c.text() for c in calls] == ["cd(folder='docs')", "ls(a=True)", 'echo(content="it\'s", file_name=\'a.txt\')']
    # BFCL's decoder strips fences and wraps a bare call in a list; so does this one
    assert [c.text() for c in parse_calls("```python\nmkdir(dir_name='x')\n```", FS_TOOLS)] == ["mkdir(dir_name='x')"]
    assert parse_calls("[]", FS_TOOLS) == []
    assert parse_calls("[cd(folder=['a', {'b': -1}])]", FS_TOOLS)[0].kwargs == (("folder", ["a", {"b": -1}]),)


@pytest.mark.parametrize("text, why", [
    ("__import__('os').system('touch /tmp/x')", "bare name"),
    ("[os.system(command='x')]", "bare name"),
    ("[GorillaFileSystem.rm(file_name='a')]", "bare name"),
    ("[open(file='x')]", "'open' is not one of this task's tools"),
    ("[eval(source='1')]", "'eval' is not one of this task's tools"),
    ("[cd(folder=__import__('os').getcwd())]", "not a literal value"),
    ("[cd(folder='a' + 'b')]", "not a literal value"),  # BFCL's own decoder evals BinOps
    ("[cd(folder=(lambda: 'x')())]", "not a literal value"),
    ("[cd('docs')]", "positional arguments; write them as name=value"),
    ("[cd(**{'folder': 'x'})]", "**kwargs is not allowed"),
    ("[cd(folder='x'), 42]", "is not a function call"),
    ("I moved the file for you.", "not a Python list of calls"),
])
def test_hostile_or_malformed_text_is_a_format_error_naming_what_is_wrong(text, why):
    with pytest.raises(CallFormatError, match="(?s).*" + __import__("re").escape(why)):
        parse_calls(text, FS_TOOLS)


def test_a_hostile_reply_executes_nothing_and_ends_the_user_turn(official, monkeypatch):
    called = []
    monkeypatch.setattr(os, "system", lambda *a: called.append(a) or 0)
    env = BfclEnv()
    task = official["multi_turn_base_0"]
    env.reset(task)
    before = repr(env.instances["GorillaFileSystem"].root)
    res = env.step("[__import__('os').system('rm -rf /'), mkdir(dir_name='temp')]")
    assert called == [] and repr(env.instances["GorillaFileSystem"].root) == before  # not even the valid call ran
    assert "bare name" in res.info["format_error"] and "command" not in res.info
    assert not res.done and res.observation.messages[0]["content"].startswith("[Not executed:")
    assert task.turns[1] in res.observation.messages[0]["content"]  # the next user turn follows


def test_refused_and_private_names_are_not_tools(official):
    table = bfcl.method_table(bfcl.make_instances(official["multi_turn_base_0"]))
    assert "mkdir" in table and "post_tweet" in table
    assert not [n for n in table if n.startswith("_")] and "_load_scenario" not in table
    with pytest.raises(CallFormatError, match="'_load_scenario' is not one of this task's tools"):
        parse_calls("[_load_scenario(scenario={})]", frozenset(table))


# ---------------------------------------------------------------------------------- BFCL's checker
def test_the_ground_truth_passes_bfcls_checker_and_a_wrong_call_fails(official):
    task = official["multi_turn_base_0"]  # 4 user turns: move, grep, sort, move + diff
    ep = run_episode(BfclEnv(), task, _scripted(bfcl.oracle_replies(task)))
    assert ep.passed and ep.end_reason == "submitted" and ep.verdict.detail == "BFCL multi-turn checker: valid"
    assert ep.turns[0].action == json.dumps(["cd(folder='document')", "mkdir(dir_name='temp')",
                                             "mv(source='final_report.pdf', destination='temp')"])
    # the same episode with the directory named wrongly in turn 1: the state check fails
    wrong = bfcl.oracle_replies(task)
    wrong[0] = wrong[0].replace("dir_name='temp'", "dir_name='tmp'")
    ep = run_episode(BfclEnv(), task, _scripted(wrong))
    assert not ep.passed and ep.verdict.detail.startswith("multi_turn:instance_state_mismatch")
    # a turn left without its calls: BFCL's empty-turn error
    skipped = ["Done."] + bfcl.oracle_replies(task)[2:]
    ep = run_episode(BfclEnv(), task, _scripted(skipped))
    assert not ep.passed and ep.verdict.detail.startswith("multi_turn:empty_turn_model_response")
    # the right state but a result missing (grep not run in turn 2): the response check fails
    no_grep = bfcl.oracle_replies(task)
    no_grep[2] = "[cd(folder='temp')]"
    ep = run_episode(BfclEnv(), task, _scripted(no_grep))
    assert not ep.passed and ep.verdict.detail.startswith("multi_turn:execution_response_mismatch")
    # the right calls for every user turn but the last: never complete, whatever the checker would say of the rest
    allowed = bfcl.tool_names(task)
    decoded = [[[c.text() for gt in turn for c in parse_calls(gt, allowed, positional=True)]] for turn in task.ground_truth]
    assert bfcl.check(task, decoded).passed
    short = bfcl.check(task, decoded[:-1])
    assert not short.passed and short.reward == 0.0 and short.detail == "force_terminated: 3 of 4 user turns were reached"


def test_checks_are_independent_and_leave_nothing_in_the_checkers_globals(official):
    from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_utils

    task = official["multi_turn_base_1"]
    before = set(vars(multi_turn_utils))
    for _ in range(2):  # the checker caches instances by name: a reused name would carry state over
        ep = run_episode(BfclEnv(), task, _scripted(bfcl.oracle_replies(task)))
        assert ep.passed
    assert set(vars(multi_turn_utils)) == before


def test_a_tampered_ground_truth_is_refused_before_the_checker_evals_it(official):
    task = official["multi_turn_base_1"]
    bad = bfcl.BfclTask(**{**task.to_dict(), "ground_truth": [["__import__('os').system('x')"], *task.ground_truth[1:]]})
    verdict = bfcl.check(bad, [[["ls(a=True)"]], [], [], []])
    assert not verdict.passed and "ground truth is not a valid call list" in verdict.detail


def test_the_step_limit_force_quits_as_bfcl_does(official):
    task = official["multi_turn_base_1"]
    env = BfclEnv(BfclConfig(max_steps_per_turn=3))
    ep = run_episode(env, task, lambda m: "[ls(a=True)]")
    assert ep.turns_used == 3 and ep.end_reason == "turn_limit" and not ep.passed
    assert ep.verdict.detail.startswith("force_terminated: the step limit was reached in user turn 1 of 4")
    assert env.max_turns == 4 * 4


def test_long_results_are_cut_with_a_visible_marker(official):
    assert bfcl.truncate("x" * 30, 10) == "xxxxx[... 20 characters truncated ...]xxxxx"
    env = BfclEnv(BfclConfig(result_chars=60))
    env.reset(official["multi_turn_base_0"])
    res = env.step("[ls(a=True)]")  # '{"current_directory_content": ["document", "archive"]}': 55 characters
    assert res.observation.messages[0]["content"] == str(
        [{"role": "tool", "name": "ls(a=True)", "content": '{"current_directory_content": ["document", "archive"]}'}])
    # '{"terminal_output": "y...y"}' is 23 + 200 characters: 163 of them cut, the head and tail kept
    res = env.step("[cd(folder='document'), echo(content='" + "y" * 200 + "')]")
    shown = res.observation.messages[0]["content"]
    assert '{"current_working_directory": "document"}' in shown
    assert '{"terminal_output": "yyyyyyyyy[... 163 characters truncated ...]' + "y" * 28 + '"}' in shown


def test_the_system_prompt_is_bfcls_default_with_the_tasks_function_docs(official):
    env = BfclEnv()
    obs = env.reset(official["multi_turn_base_0"].to_dict())  # a task's dict is read as the task
    assert env.task == official["multi_turn_base_0"]
    system, user = obs.messages
    assert (system["role"], system["kind"], user["role"], user["kind"]) == ("system", "system", "user", "instruction")
    assert set(system) == set(user) == {"role", "content", "kind"}
    assert system["content"].startswith("You are an expert in composing functions.")
    assert "[func_name1(params_name1=params_value1, params_name2=params_value2...), func_name2(params)]" in system["content"]
    assert '"name": "post_tweet"' in system["content"] and '"name": "mkdir"' in system["content"]
    assert '"name": "send_message"' not in system["content"]  # MessageAPI is not involved in this item
    assert user["content"] == official["multi_turn_base_0"].turns[0]


def test_the_official_split_is_200_items_each_passed_by_its_ground_truth_and_failed_by_silence(official):
    assert len(official) == 200
    for task in list(official.values())[::20]:  # every 20th: the whole set runs in bfcl_base's check
        assert run_episode(BfclEnv(), task, _scripted(bfcl.oracle_replies(task))).passed, task.task_id
        assert not run_episode(BfclEnv(), task, lambda m: "Sure.").passed, task.task_id


# ---------------------------------------------------------------------------------- generated tasks
def test_every_generated_task_is_solved_by_its_oracle_and_failed_by_doing_nothing():
    tasks = bfcl_tasks.generate_tasks()
    assert len(tasks) == 240 and bfcl_tasks.split_counts(tasks) == {(lv, s): n for lv in (1, 2, 3) for s, n in (("test", 30), ("train", 50))}
    for t in tasks:
        assert run_episode(BfclEnv(), t, _scripted(bfcl.oracle_replies(t))).passed, t.task_id
        assert not run_episode(BfclEnv(), t, lambda m: "[]").passed, t.task_id
    assert bfcl_tasks.generate_tasks(seed=0) == tasks and bfcl_tasks.generate_tasks(seed=1) != tasks


def test_a_generated_task_checks_state_and_results_by_hand():
    task = bfcl_tasks.make_task(2, 0)  # write_in_dir
    assert task.family == "write_in_dir" and task.ground_truth[0][0].startswith("cd(folder=")
    d = task.ground_truth[0][0].split("'")[1]
    name = task.ground_truth[0][1].split("'")[1]
    right = [f"[cd(folder='{d}'), touch(file_name='{name}'), echo(content={task.turns[0].split(chr(39))[5]!r}, file_name='{name}')]", "ok"]
    assert run_episode(BfclEnv(), task, _scripted(right)).passed
    typo = [right[0].replace("content='", "content='X"), "ok"]  # wrong text written: the file system differs
    ep = run_episode(BfclEnv(), task, _scripted(typo))
    assert not ep.passed and "instance_state_mismatch" in ep.verdict.detail
    with pytest.raises(ValueError, match="BFCL task level 4: choose from 1, 2, 3"):
        bfcl_tasks.make_task(4, 0)


def test_task_rows_round_trip_and_load_into_the_environment(home):
    t = bfcl_tasks.make_task(3, 2)
    row = t.task_row()
    assert row["environment"] == "bfcl" and row["prompt"] == "\n".join(t.turns)
    assert bfcl.BfclTask.from_task_row(row) == t
    with pytest.raises(ValueError, match=r"^BFCL task id .*: use letters, digits and '_' only \(BFCL's checker makes Python names from it\)$"):
        bfcl.BfclTask(**{**t.to_dict(), "task_id": "x-1; import os"})
    lake = Lakehouse(Paths.from_env(home).ensure().lakehouse)
    lake.write_batch("tasks", "b1", batches.bfcl_task_rows("b1", [t], now_utc(), max_turns=3))
    ((r, loaded),) = load_tasks(lake, "b1")
    assert loaded == bfcl.BfclTask(**{**t.to_dict(), "metadata": {"max_turns": 3}}) and json.loads(r["metadata"])["max_turns"] == 3
    env = make_env("bfcl", 3)
    assert isinstance(env, BfclEnv) and env.config.max_steps_per_turn == 3


def test_batches_take_the_training_split_only():
    tasks = batches.bfcl_training_tasks(5, 6, (1, 3))
    assert [t.level for t in tasks] == [1, 3, 1, 3, 1, 3] and {t.split for t in tasks} == {"train"}
    assert [int(t.task_id.split("_")[3]) for t in tasks] == [30, 30, 31, 31, 32, 32]
    held = {batches.bfcl_fingerprint(t) for t in batches.bfcl_held_out_tasks()}
    assert not held & {batches.bfcl_fingerprint(t) for t in batches.bfcl_training_tasks(0, 100, (1, 2, 3))}
    with pytest.raises(ValueError, match=r"bfcl levels must be a non-empty subset of \[1, 2, 3\], got \[0\]"):
        batches.bfcl_training_tasks(1, 2, (0,))


def test_reviews_of_bfcl_episodes_name_bfcl_hints():
    assert failure_type(passed=False, end_reason="submitted", check_kind="bfcl", format_errors=1, turns=3) == "wrong_calls"
    review = verdict_review(passed=False, reward=0.0, detail="x", end_reason="submitted", check_kind="bfcl", format_errors=3,
                            turns=3, max_turns=8)
    assert review["failure"] == "format" and "Python list of calls" in review["hint"]


# ---------------------------------------------------------------------------------- the contamination guard
def test_the_guard_indexes_the_official_items_and_passes_generated_ones(official):
    items, _, skipped = contamination.static_items(["bfcl"], None)
    assert skipped == {} and len(items) == 200 and {i.benchmark for i in items} == {"bfcl"}
    index = contamination.ContaminationIndex(items)
    generated = [t.prompt for t in bfcl_tasks.generate_tasks()]
    assert index.match(generated, use_embeddings=False) == [None] * len(generated)
    item = official["multi_turn_base_7"]
    (m,) = index.match([item.prompt], use_embeddings=False)
    assert (m.benchmark, m.item_id, m.tier) == ("bfcl", "multi_turn_base_7", "exact")
    # pasted inside a longer prompt: the n-gram tier
    (m,) = index.match(["Please do this for me. " + item.prompt + " Thanks a lot."], use_embeddings=False)
    assert (m.item_id, m.tier) == ("multi_turn_base_7", "ngram")


def test_a_bfcl_episode_lands_as_a_rollout_row_with_its_calls_and_level():
    from tentalis_pipelines.env_batches import episode_record, episode_rollout_rows

    task = bfcl_tasks.make_task(3, 0)  # copy_then_sort: 2 user turns
    ep = run_episode(BfclEnv(), task, _scripted(bfcl.oracle_replies(task)))
    rec = episode_record(ep, task)
    assert (rec["environment"], rec["check_kind"], rec["level"], rec["passed"], rec["turns"]) == ("bfcl", "bfcl", 3, True, 4)
    (row,) = episode_rollout_rows("b1", task, 0, ep, policy_version="base", model="m", temperature=0.0, max_tokens=8,
                                  created_at=now_utc())
    assert [json.loads(s) if s else [] for s in row["steps"]] == [task.ground_truth[0], [],
                                                                   task.ground_truth[1], []]
    assert row["parse_mode"] == "episode:submitted" and json.loads(row["episode"])["level"] == 3


def test_the_cli_takes_bfcl_levels_1_to_3():
    import typer

    from tentalis_pipelines.cli.common import parse_levels

    assert parse_levels("1,3", "bfcl") == [1, 3]
    with pytest.raises(typer.Exit):
        parse_levels("0", "bfcl")


# ---------------------------------------------------------------------------------- the contract at its edges
def test_a_missing_wheel_or_data_file_is_unavailable_with_the_install_command(monkeypatch, tmp_path):
    import importlib.util

    monkeypatch.setattr(bfcl, "package_dir", lambda: tmp_path)
    with pytest.raises(bfcl.BfclUnavailable, match=r"^bfcl-eval is installed but .*BFCL_v4_multi_turn_base\.json is "
                                                    r"missing; reinstall it \(pip install --no-deps bfcl-eval==.*\)\)$"):
        bfcl.data_dir()
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / bfcl.DATA_FILE).write_text("")
    assert bfcl.data_dir() == tmp_path / "data"
    monkeypatch.undo()
    assert (bfcl.package_dir() / "data" / bfcl.DATA_FILE).exists()
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "bfcl_eval" else real(name, *a))
    with pytest.raises(bfcl.BfclUnavailable, match=r"^the BFCL environment needs the bfcl-eval package: pip install --no-deps bfcl-eval==.*\)$"):
        bfcl.package_dir()
    assert issubclass(bfcl.BfclUnavailable, EnvironmentUnavailable)


def test_function_docs_are_the_classes_own_and_an_unknown_class_is_named():
    docs = bfcl.function_docs("MathAPI")
    assert isinstance(docs, tuple) and "mean" in {d["name"] for d in docs} and "mkdir" not in {d["name"] for d in docs}
    with pytest.raises(ValueError, match=r"^no BFCL simulator class 'Maths'; known: GorillaFileSystem, MathAPI, .*MemoryAPI_rec_sum$"):
        bfcl.function_docs("Maths")


def test_a_task_refuses_an_unsafe_id_and_mismatched_turns_naming_both(official):
    t = official["multi_turn_base_1"]
    for bad in ("", "a-b", "a b", "a.b", "x\n", "\nx", "é"):
        with pytest.raises(ValueError, match=r"^BFCL task id .*: use letters, digits and '_' only \(BFCL's checker makes Python names from it\)$"):
            bfcl.BfclTask(**{**t.to_dict(), "task_id": bad})
    assert bfcl.BfclTask(**{**t.to_dict(), "task_id": "Az_09"}).task_id == "Az_09"
    with pytest.raises(ValueError, match=r"^task multi_turn_base_1: 4 user turns but 3 ground-truth turns$"):
        bfcl.BfclTask(**{**t.to_dict(), "ground_truth": t.ground_truth[:3]})
    assert t.kind == "bfcl" and t.prompt == "\n".join(t.turns) and t.prompt.count("\n") >= 3
    assert t.test_entry() == {"id": "multi_turn_base_1", "initial_config": t.initial_config,
                              "involved_classes": t.involved_classes}
    assert bfcl.BfclTask.from_dict(t.to_dict()) == t


def test_task_rows_keep_every_field_and_old_rows_read_with_defaults(official):
    t = bfcl.BfclTask(task_id="g_1", turns=["a", "b"], initial_config={"MathAPI": {}}, involved_classes=["MathAPI"],
                      ground_truth=[["mean(numbers=[1])"], []], level=2, family="fam", split="train", seed=7,
                      metadata={"max_turns": 5})
    row = t.task_row()
    assert (row["task_id"], row["environment"], row["prompt"]) == ("g_1", "bfcl", "a\nb")
    assert json.loads(row["reference"]) == t.ground_truth
    assert json.loads(row["metadata"]) == {"level": 2, "family": "fam", "split": "train", "seed": 7, "turns": ["a", "b"],
                                           "initial_config": {"MathAPI": {}}, "involved_classes": ["MathAPI"], "max_turns": 5}
    assert bfcl.BfclTask.from_task_row(row) == t
    meta = json.loads(row["metadata"])
    del meta["split"], meta["seed"]
    old = bfcl.BfclTask.from_task_row({**row, "metadata": json.dumps(meta)})
    assert (old.split, old.seed, old.metadata) == ("train", 0, {"max_turns": 5})


def test_official_items_are_level_0_test_items_with_every_user_message_of_a_turn(official):
    with pytest.raises(ValueError, match=r"^only 'multi_turn_base' is supported \(got 'multi_turn_long_context'\)$"):
        bfcl.load_official("multi_turn_long_context")
    t = official["multi_turn_base_0"]
    assert (t.level, t.family, t.split, t.seed) == (0, "multi_turn_base", "test", 0)
    assert t.involved_classes == ["TwitterAPI", "GorillaFileSystem"] and "path" in t.metadata
    assert len(t.turns) == len(t.ground_truth) == 4 and all(t.turns)


def test_instances_start_from_a_copy_of_the_config_and_unknown_classes_are_named(official):
    t = official["multi_turn_base_0"]
    before = json.dumps(t.initial_config, sort_keys=True)
    inst = bfcl.make_instances(t)
    assert list(inst) == ["TwitterAPI", "GorillaFileSystem"]
    table = bfcl.method_table(inst)
    table["mkdir"](dir_name="new_dir")
    table["cd"](folder="document")
    table["touch"](file_name="z.txt")
    assert json.dumps(t.initial_config, sort_keys=True) == before  # the task's config is never touched
    assert "new_dir" not in json.dumps(bfcl.make_instances(t)["GorillaFileSystem"].root.__dict__, default=str)
    assert inst["GorillaFileSystem"].long_context is False  # BFCL's base category: no long-context padding
    # the configured state is loaded (the user's name from the config), MathAPI (stateless) needs none
    assert inst["TwitterAPI"].username == t.initial_config["TwitterAPI"]["username"]
    math = bfcl.BfclTask(task_id="m", turns=["x"], initial_config={}, involved_classes=["MathAPI"], ground_truth=[[]])
    assert "mean" in bfcl.tool_names(math)
    with pytest.raises(ValueError, match=r"^task m: unknown BFCL class 'ShellAPI'$"):
        bfcl.make_instances(bfcl.BfclTask(**{**math.to_dict(), "involved_classes": ["MathAPI", "ShellAPI"]}))


def test_the_whitelist_has_public_unrefused_methods_and_a_later_class_wins_a_shared_name():
    class First:
        def ls(self):
            return "first"

        def kill(self):
            return "killed"

        def run(self):
            return "ran"

        def _private(self):
            return "p"

        name = "not a method"
        count = 3

    class Second:
        def ls(self):
            return "second"

        def cat(self):
            return "c"

    table = bfcl.method_table({"First": First(), "Second": Second()})
    assert sorted(table) == ["cat", "ls"] and table["ls"]() == "second"
    assert bfcl.method_table({"First": First()})["ls"]() == "first"
    assert {"kill", "exit", "quit", "remove", "unlink", "popen", "Popen", "run"} <= bfcl.REFUSED_NAMES


def test_call_text_is_positional_then_keyword_literals_by_repr():
    assert bfcl.Call("f", (("a", "x"), ("b", [1, None])), (3, "y")).text() == "f(3, 'y', a='x', b=[1, None])"
    assert bfcl.Call("g", ()).text() == "g()"


@pytest.mark.parametrize("text", [
    "mean(numbers=[1])", "[mean(numbers=[1])]", "```python\nmean(numbers=[1])\n```", "```py\n[mean(numbers=[1])]\n```",
    "```json\nmean(numbers=[1])\n```", "  'mean(numbers=[1])'\n", "\n`[mean(numbers=[1])]`\n", "(mean(numbers=[1]))",
])
def test_bfcls_decoder_forms_all_read_as_the_same_call(text):
    assert [c.text() for c in parse_calls(text, {"mean"})] == ["mean(numbers=[1])"]


def test_several_calls_in_a_tuple_and_positional_arguments_where_allowed():
    calls = parse_calls("[mean(numbers=[1]), (add(a=1, b=2))]", {"mean", "add"})
    assert [c.name for c in calls] == ["mean", "add"]
    # two lists side by side parse as a tuple of lists: its first element is named, not the whole
    with pytest.raises(CallFormatError, match=r"^'\[mean\(numbers=\[1\]\)\]' is not a function call$"):
        parse_calls("[mean(numbers=[1])], [add(a=1)]", {"mean", "add"})
    (c,) = parse_calls("[add(1, b=2.5)]", {"add"}, positional=True)
    assert c.args == (1,) and c.kwargs == (("b", 2.5),) and c.text() == "add(1, b=2.5)"
    with pytest.raises(CallFormatError, match=r"^add\(\.\.\.\): \*args is not allowed$"):
        parse_calls("[add(*[1, 2])]", {"add"}, positional=True)
    with pytest.raises(CallFormatError, match=r"^add\(\.\.\.\): argument 'x' is not a literal value$"):
        parse_calls("[add(x)]", {"add"}, positional=True)


def test_a_reply_over_20000_characters_is_refused_by_its_length():
    call = "[mean(numbers=[" + ",".join(["1"] * 9000)  # 19,999 characters with the closing ]
    call += "0" * (20000 - len(call) - 3) + "])]"
    assert len(call) == 20000 and parse_calls(call, {"mean"})[0].name == "mean"
    longer = call[:-3] + "0])]"
    with pytest.raises(CallFormatError, match=r"^the reply is 20001 characters long; a call list is expected$"):
        parse_calls(longer, {"mean"})


def test_format_errors_name_the_offending_text_exactly():
    cases = {
        "[mean(numbers=[1]), 42]": "'42' is not a function call",
        "[os.system(command='x')]": "'os.system': call a tool by its bare name (no attribute access)",
        "[rm(file_name='x')]": "'rm' is not one of this task's tools",
        "[mean([1])]": "mean(...) has positional arguments; write them as name=value",
        "[mean(**{'numbers': [1]})]": "mean(...): **kwargs is not allowed",
        "[mean(numbers=x)]": "mean(...): argument 'x' is not a literal value",
        "[mean(numbers=[1]": "not a Python list of calls (",
    }
    for text, why in cases.items():
        with pytest.raises(CallFormatError) as exc:
            parse_calls(text, {"mean"})
        assert str(exc.value).startswith(why), (text, str(exc.value))
    with pytest.raises(CallFormatError, match=r"^'" + "x" * 60 + "' is not a function call$"):
        parse_calls("[" + "x" * 100 + "]", {"mean"})


def test_results_are_rendered_as_bfcls_executor_renders_them_and_failures_are_recognised():
    assert bfcl.result_text("as is") == "as is" and bfcl.result_text({"a": [1]}) == '{"a": [1]}'
    assert bfcl.result_text({"a": {1, 2}}) == str({"a": {1, 2}})  # not JSON: its str
    assert bfcl.result_text([1, "x"]) == "[1, 'x']" and bfcl.result_text(None) == "None"

    class Tools:
        def add(self, a, b=0):
            return {"sum": a + b}

        def boom(self):
            raise KeyError("no such file")

    t = Tools()
    calls = [bfcl.Call("add", (("b", 2),), (1,)), bfcl.Call("boom", ()), bfcl.Call("add", (("a", 5),))]
    results = bfcl.execute(calls, {"add": t.add, "boom": t.boom})
    assert results == ['{"sum": 3}', "Error during execution: 'no such file'", '{"sum": 5}']
    assert [bfcl.call_failed(r) for r in results] == [False, True, False]
    assert bfcl.call_failed('{"error": "No such file"}') and not bfcl.call_failed('["error"]')
    assert not bfcl.call_failed("error: plain text") and not bfcl.call_failed('"error"')
    assert not bfcl.call_failed("x Error during execution: y")


def test_truncation_keeps_the_text_up_to_the_limit_and_splits_head_and_tail():
    assert bfcl.truncate("x" * 10, 10) == "x" * 10
    assert bfcl.truncate("abcdefghijk", 10) == "abcde[... 1 characters truncated ...]ghijk"
    assert bfcl.truncate("abcdefghijk", 5) == "ab[... 6 characters truncated ...]ijk"
    assert bfcl.truncate("a" * 2005, 2) == "a[... 2,003 characters truncated ...]a"


def test_the_checkers_invalid_verdict_and_its_crash_are_reported_with_their_reason(official, monkeypatch):
    from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_checker as mtc
    from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_utils

    task = official["multi_turn_base_1"]
    seen = []

    def invalid(decoded, truth, entry, category, model):
        seen.append((category, model, entry))
        vars(multi_turn_utils)[model + "_leftover"] = 1
        return {"valid": False, "error_message": "m" * 400}

    monkeypatch.setattr(mtc, "multi_turn_checker", invalid)
    v = bfcl.check(task, [[]] * 4)
    assert v == Verdict(False, 0.0, "invalid: " + "m" * 300)
    (category, model, entry), = seen
    assert category == "multi_turn_base" and model.startswith("tentalis_") and entry == task.test_entry()
    assert not [k for k in vars(multi_turn_utils) if k.startswith("tentalis_")]

    def crash(*a):
        raise AssertionError("instances differ")

    monkeypatch.setattr(mtc, "multi_turn_checker", crash)
    assert bfcl.check(task, [[]] * 4) == Verdict(False, 0.0, "checker error: AssertionError: instances differ")
    assert bfcl.check(task, []).detail == "force_terminated: 0 of 4 user turns were reached"
    assert bfcl.check(task, [[]] * 5).detail == "force_terminated: 5 of 4 user turns were reached"


def test_the_env_counts_turns_user_turns_and_failed_calls(official):
    assert BfclConfig() == BfclConfig(max_steps_per_turn=20, max_turns=None, result_chars=2000)
    env = BfclEnv()
    assert env.max_turns == 21  # before reset: one user turn's worth
    with pytest.raises(RuntimeError, match=r"^step\(\) after the episode ended \(or before reset\)$"):
        env.step("[]")
    with pytest.raises(RuntimeError, match=r"^verify\(\) before reset\(\)$"):
        env.verify()
    task = official["multi_turn_base_0"]
    env.reset(task)
    assert env.max_turns == 4 * 21 and BfclEnv(BfclConfig(max_turns=5)).max_turns == 5
    res = env.step("[cd(folder='nowhere'), ls(a=True), cd(folder='document')]")
    assert (res.info["turn"], res.info["user_turn"], res.info["failed_calls"]) == (1, 0, 1)
    assert res.info["calls"] == ["cd(folder='nowhere')", "ls(a=True)", "cd(folder='document')"]
    assert json.loads(res.info["command"]) == res.info["calls"] and not res.done and res.reward == 0.0
    assert res.observation.messages[0]["kind"] == "observation" and "force_quit" not in res.info
    res = env.step("All done.")
    assert (res.info["turn"], res.info["user_turn"]) == (2, 0) and "format_error" in res.info
    assert res.observation.messages == [{"role": "user", "content": "[Not executed: " + res.info["format_error"] + ".]\n"
                                         + task.turns[1], "kind": "instruction"}]
    res = env.step("[]")  # no calls, nothing wrong: the next user turn, with no note
    assert res.info["user_turn"] == 1 and "format_error" not in res.info
    assert res.observation.messages == [{"role": "user", "content": task.turns[2], "kind": "instruction"}]
    assert env.decoded == [[["cd(folder='nowhere')", "ls(a=True)", "cd(folder='document')"]], [], []]
    res = env.step("[]")
    assert not res.done and env.user_turn == 3
    res = env.step("[]")  # past the last user turn: the episode is over
    assert res.done and res.info["end_reason"] == "submitted" and not res.info["passed"]
    assert res.observation.messages == [{"role": "user", "content": "[episode over]", "kind": "observation"}]
    assert res.info["detail"] == env.verify().detail and env.verify() is env.verify()  # decided once
    env.close()
    assert env.instances == {} and env.table == {}


def test_the_step_limit_is_hit_exactly_and_the_turn_limit_too(official):
    task = official["multi_turn_base_1"]
    env = BfclEnv(BfclConfig(max_steps_per_turn=2))
    env.reset(task)
    assert not env.step("[ls(a=True)]").done
    res = env.step("[ls(a=True)]")
    assert res.done and res.info["force_quit"] is True and res.info["end_reason"] == "turn_limit"
    assert env.verify() == Verdict(False, 0.0, "force_terminated: the step limit was reached in user turn 1 of 4")
    assert res.info["detail"] == env.verify().detail and res.reward == 0.0
    assert res.observation.messages[0]["kind"] == "observation"  # the results are still shown
    env = BfclEnv(BfclConfig(max_steps_per_turn=2))
    env.reset(task)
    env.step("[ls(a=True)]")
    env.step("[]")  # a new user turn starts the step count again
    assert not env.step("[ls(a=True)]").done
    assert env.step("[ls(a=True)]").info["detail"].endswith("in user turn 2 of 4")
    env = BfclEnv(BfclConfig(max_turns=2))
    env.reset(task)
    assert not env.step("[]").done
    res = env.step("[ls(a=True)]")
    assert res.done and res.info["end_reason"] == "turn_limit" and "force_quit" not in res.info


def test_a_probe_before_the_end_runs_the_checker_and_an_error_end_scores_zero(official):
    task = official["multi_turn_base_1"]
    env = BfclEnv()
    env.reset(task)
    assert env.verify().detail == "force_terminated: 1 of 4 user turns were reached"
    env._finish("error: the simulator broke")
    assert env.verify() == Verdict(False, 0.0, "error: the simulator broke")
    env = BfclEnv()
    env.reset(task)
    env._finish("hostile: escaped")
    assert env.verify() == Verdict(False, 0.0, "hostile: escaped")


def test_the_oracle_ends_each_turn_and_binds_positional_ground_truth_to_names(official):
    task = official["multi_turn_base_167"]  # its last user turn has no ground-truth calls
    replies = bfcl.oracle_replies(task)
    assert replies[-1] == "Done." and replies[-2] == "Done." and replies.count("Done.") == len(task.turns)
    t = bfcl.BfclTask(task_id="m", turns=["x"], initial_config={}, involved_classes=["MathAPI"],
                      ground_truth=[["add(1, 2)"]])
    assert bfcl.keyword_reply(["add(1, 2)", "mean(numbers=[3])"], t) == "[add(a=1, b=2), mean(numbers=[3])]"


def test_official_items_join_every_user_message_of_a_turn_and_keep_their_path(monkeypatch, tmp_path):
    # The shipped file has one user message per turn; BFCL's format allows several (and other roles).
    (tmp_path / "possible_answer").mkdir()
    items = [{"id": "multi_turn_base_9", "question": [[{"role": "user", "content": "first"}, {"role": "system", "content": "s"},
                                                       {"role": "user", "content": "second"}], [{"role": "user", "content": "third"}]],
              "initial_config": {}, "involved_classes": ["MathAPI"], "path": ["MathAPI.mean"]},
             {"id": "multi_turn_base_10", "question": [[{"role": "user", "content": "only"}]], "initial_config": {},
              "involved_classes": ["MathAPI"]}]
    (tmp_path / bfcl.DATA_FILE).write_text("\n".join(json.dumps(q) for q in items) + "\n\n")
    (tmp_path / "possible_answer" / bfcl.DATA_FILE).write_text(
        json.dumps({"id": "multi_turn_base_10", "ground_truth": [[]]}) + "\n"
        + json.dumps({"id": "multi_turn_base_9", "ground_truth": [["mean(numbers=[1])"], []]}) + "\n")
    monkeypatch.setattr(bfcl, "data_dir", lambda: tmp_path)
    a, b = bfcl.load_official()
    assert a.turns == ["first\nsecond", "third"] and a.ground_truth == [["mean(numbers=[1])"], []]
    assert a.metadata == {"path": ["MathAPI.mean"]} and b.metadata == {"path": []} and b.ground_truth == [[]]
    assert (a.level, a.family, a.split) == (0, "multi_turn_base", "test")


def test_the_checkers_verdicts_are_exact(official, monkeypatch):
    from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_checker as mtc

    task = official["multi_turn_base_1"]
    allowed = bfcl.tool_names(task)
    decoded = [[[c.text() for gt in turn for c in parse_calls(gt, allowed, positional=True)]] for turn in task.ground_truth]
    assert bfcl.check(task, decoded) == Verdict(True, 1.0, "BFCL multi-turn checker: valid")
    assert bfcl.check(task, decoded[:1]) == Verdict(False, 0.0, "force_terminated: 1 of 4 user turns were reached")
    bad = bfcl.BfclTask(**{**task.to_dict(), "ground_truth": [["kill(pid=1)"], *task.ground_truth[1:]]})
    assert bfcl.check(bad, decoded) == Verdict(
        False, 0.0, "error: the task's ground truth is not a valid call list: 'kill' is not one of this task's tools")
    monkeypatch.setattr(mtc, "multi_turn_checker", lambda *a: {"valid": False})
    assert bfcl.check(task, decoded) == Verdict(False, 0.0, "invalid: ")  # neither a type nor a message
    monkeypatch.setattr(mtc, "multi_turn_checker", lambda *a: {"valid": False, "error_type": "multi_turn:x", "error_message": 7})
    assert bfcl.check(task, decoded) == Verdict(False, 0.0, "multi_turn:x: 7")


def test_the_system_prompt_holds_each_part_of_bfcls_default_in_order():
    functions = [{"name": "mean", "parameters": {"numbers": "list"}}]
    prompt = bfcl.system_prompt(functions)
    assert prompt.startswith("You are an expert in composing functions.You are given a question and a set of possible "
                             "functions.")
    assert "[func_name1(params_name1=params_value1, params_name2=params_value2...), func_name2(params)].  You SHOULD NOT " \
           "include any other text in the response.\n\nAt each turn, you should try your best" in prompt  # no param types for Python
    assert "None" not in prompt
    assert prompt.endswith("Here is a list of functions in json format that you can invoke.\n"
                           + json.dumps(functions, indent=4) + "\n")


def test_an_argument_is_named_by_its_first_60_characters():
    arg = "f(" + "x" * 80 + ")"
    with pytest.raises(CallFormatError, match=r"^mean\(\.\.\.\): argument '" + re.escape(arg[:60]) + r"' is not a literal value$"):
        parse_calls(f"[mean(numbers={arg})]", {"mean"})


def test_a_step_with_calls_shows_its_results_as_a_user_message_and_times_itself(official):
    env = BfclEnv()
    env.reset(official["multi_turn_base_0"])
    res = env.step("[pwd()]")
    assert res.observation.messages == [{"role": "user", "kind": "observation", "content": str(
        [{"role": "tool", "name": "pwd()", "content": '{"current_working_directory": "/workspace"}'}])}]
    assert 0.0 <= res.info["env_seconds"] < 5.0
    for reply in ("[]", "[]", "[]", "[]"):
        res = env.step(reply)
    assert res.done and res.info["passed"] is False and res.info["end_reason"] == "submitted"


def test_the_decoder_strips_only_fences_newlines_spaces_and_quotes():
    assert parse_calls("```python\n`mean(numbers=[1])`\n```", {"mean"})[0].text() == "mean(numbers=[1])"
    for text in ("[mean(numbers=[1])]X", "```python\nmean(numbers=[1])X\n```", "'[mean(numbers=[1])]X'",
                 "X[mean(numbers=[1])]"):
        with pytest.raises(CallFormatError):  # an X is text, not decoration: the reply is not a call list
            parse_calls(text, {"mean"})


def test_an_expression_that_is_not_a_list_is_named_whole():
    with pytest.raises(CallFormatError, match=r"^'\[mean\(numbers=\[1\]\)\]\[0\]' is not a function call$"):
        parse_calls("[mean(numbers=[1])][0]", {"mean"})
    with pytest.raises(CallFormatError, match=r"^'" + "o" * 58 + r"\.f': call a tool by its bare name \(no attribute access\)$"):
        parse_calls("[" + "o" * 58 + ".f.g()]", {"mean"})
