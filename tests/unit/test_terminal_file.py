"""Bring-your-own terminal tasks from a JSONL file: each validation rule names the file, the line and the
fix; a bad line is quarantined with its batch and the good lines become tasks."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path

import pytest

from tentalis_pipelines.envs.terminal_tasks import check_tree, verify
from tentalis_pipelines.tasks import batches
from tentalis_pipelines.tasks.terminal_file import (
    TerminalFileError,
    is_terminal_task_file,
    read_terminal_file,
)

GOOD = {"instruction": "How many lines does notes.txt have? Submit the number.", "files": {"notes.txt": "a\nb\n"},
        "check": {"kind": "answer", "expected": "2"}}
TREE = {"id": "tidy", "instruction": "Delete old.txt and write done to out.txt.", "files": {"old.txt": "x", "logs/": ""},
        "check": {"kind": "tree", "files": {"out.txt": "done\n", "old.txt": {"absent": True}, "logs": {"dir": True},
                                            "notes.md": {"exists": True}}},
        "solution": ["rm old.txt", "echo done > out.txt", "submit"], "level": 3, "split": "heldout"}


def _file(tmp_path: Path, *lines: object, name: str = "mine.jsonl") -> Path:
    path = tmp_path / name
    path.write_text("".join((ln if isinstance(ln, str) else json.dumps(ln)) + "\n" for ln in lines))
    return path


def _one_error(tmp_path, bad: object) -> str:
    path = _file(tmp_path, GOOD, bad)
    parsed = read_terminal_file(path)
    assert len(parsed.tasks) == 1  # the good line still becomes a task
    (error,) = parsed.errors()
    assert error.startswith(f"{path}:2: ") and "; fix: " in error
    return error


def test_good_lines_become_terminal_tasks_with_their_check_tree_and_split(tmp_path):
    parsed = read_terminal_file(_file(tmp_path, GOOD, TREE))
    answer, tree = parsed.tasks
    assert (answer.task_id, answer.level, answer.split, answer.check) == ("mine-L00001", 1, "train", {"kind": "answer", "expected": "2"})
    assert answer.tree == {"notes.txt": "a\nb\n"} and answer.solution == []
    assert (tree.task_id, tree.level, tree.split, tree.solution[-1]) == ("tidy", 3, "test", "submit")
    assert tree.check == {"kind": "tree", "rules": [{"path": "out.txt", "file": "done\n"}, {"path": "old.txt", "absent": True},
                                                    {"path": "logs", "dir": True}, {"path": "notes.md", "exists": True}]}
    assert parsed.train == [answer] and parsed.held_out == [tree] and not parsed.rejects
    # The checks are the gym's own: an answer, and a final tree with an "exists" rule.
    assert verify(answer, " 2\n", None).passed and not verify(answer, "3", None).passed
    final = {"out.txt": {"type": "file", "text": "done"}, "logs": {"type": "dir"}, "notes.md": {"type": "dir"}}
    assert check_tree(tree.check, final).passed
    assert check_tree(tree.check, {k: v for k, v in final.items() if k != "notes.md"}).detail == "notes.md should exist"


def test_a_missing_instruction_is_refused_with_the_fix(tmp_path):
    assert "no 'instruction'" in _one_error(tmp_path, {"files": {}, "check": GOOD["check"]})
    assert "no 'instruction'" in _one_error(tmp_path, {**GOOD, "instruction": "   "})


@pytest.mark.parametrize("path", ["../x", "/etc/passwd", "a/../../b", "logs//app.log", "./x", "", "a\\b"])
def test_a_path_escaping_the_tree_or_not_plain_is_refused(tmp_path, path):
    error = _one_error(tmp_path, {**GOOD, "files": {path: "x"}})
    assert repr(path) in error or "empty" in error
    error = _one_error(tmp_path, {**GOOD, "check": {"kind": "tree", "files": {path: "x"}}})
    assert "'check'.files" in error


def test_an_escaping_path_names_the_way_out(tmp_path):
    assert "leaves the task's folder" in _one_error(tmp_path, {**GOOD, "files": {"/etc/passwd": "x"}})
    assert "leaves the task's folder" in _one_error(tmp_path, {**GOOD, "files": {"../x": "x"}})


@pytest.mark.parametrize("content", [42, None, ["a"], {"text": "a"}, True])
def test_non_string_content_is_refused(tmp_path, content):
    assert "the content must be text" in _one_error(tmp_path, {**GOOD, "files": {"n.txt": content}})


@pytest.mark.parametrize("check", [{"kind": "regex", "pattern": "a"}, {"expected": "2"}, {"kind": None}])
def test_an_unknown_check_kind_is_refused_naming_the_kinds(tmp_path, check):
    assert "is unknown; fix: use one of answer, tree" in _one_error(tmp_path, {**GOOD, "check": check})


def test_other_check_mistakes_are_refused(tmp_path):
    assert "no 'check'" in _one_error(tmp_path, {k: v for k, v in GOOD.items() if k != "check"})
    assert "'check'.expected is missing" in _one_error(tmp_path, {**GOOD, "check": {"kind": "answer"}})
    assert "is not an answer" in _one_error(tmp_path, {**GOOD, "check": {"kind": "answer", "expected": True}})
    assert "needs 'files'" in _one_error(tmp_path, {**GOOD, "check": {"kind": "tree", "files": {}}})
    assert "is not a rule" in _one_error(tmp_path, {**GOOD, "check": {"kind": "tree", "files": {"a": {"exists": False}}}})
    assert "unknown key(s) ['instruktion']" in _one_error(tmp_path, {**GOOD, "instruktion": "x"})
    assert "'level'" in _one_error(tmp_path, {**GOOD, "level": 100}) and "'level'" in _one_error(tmp_path, {**GOOD, "level": True})
    assert "'split' 'test' is unknown" in _one_error(tmp_path, {**GOOD, "split": "test"})
    assert "'solution'" in _one_error(tmp_path, {**GOOD, "solution": "ls"})
    assert "invalid JSON" in _one_error(tmp_path, "{not json")
    assert "expected a JSON object" in _one_error(tmp_path, "[1, 2]")
    # a number as the expected answer is its text
    assert read_terminal_file(_file(tmp_path, {**GOOD, "check": {"kind": "answer", "expected": 7}})).tasks[0].check["expected"] == "7"


def test_an_empty_file_is_an_error_of_the_whole_file(tmp_path):
    for text in ("", "\n  \n"):
        path = tmp_path / "empty.jsonl"
        path.write_text(text)
        with pytest.raises(TerminalFileError, match=r"empty.jsonl: the file holds no task; fix: write one JSON object per line"):
            read_terminal_file(path)
    with pytest.raises(TerminalFileError, match="no such task file"):
        read_terminal_file(tmp_path / "absent.jsonl")


def test_duplicate_task_ids_are_refused_after_the_first(tmp_path):
    path = _file(tmp_path, {**GOOD, "id": "a"}, {**GOOD, "id": "b"}, {**GOOD, "id": "a"}, {**GOOD, "id": 7}, {**GOOD, "id": "7"})
    parsed = read_terminal_file(path)
    assert [t.task_id for t in parsed.tasks] == ["a", "b", "7"]
    assert parsed.errors() == [f"{path}:3: duplicate id 'a' (line 1 has it too); fix: give every task its own id",
                               f"{path}:5: duplicate id '7' (line 4 has it too); fix: give every task its own id"]


def test_a_terminal_task_file_is_told_from_a_math_file(tmp_path):
    assert is_terminal_task_file(_file(tmp_path, "oops", GOOD))
    assert not is_terminal_task_file(_file(tmp_path, {"prompt": "1+1", "reference": "2"}, name="math.jsonl"))
    assert not is_terminal_task_file(tmp_path / "none.jsonl")


def test_a_file_batch_quarantines_its_bad_line_and_its_good_lines_become_task_rows(tmp_path):
    path = _file(tmp_path, GOOD, {**GOOD, "files": {"../x": "x"}}, {**GOOD, "id": "second", "level": 0}, TREE)
    bid = batches.register_terminal_file_batch(tmp_path / "b", path, num_tasks=8)
    manifest = json.loads((tmp_path / "b" / bid / "manifest.json").read_text())
    assert manifest["family"] == "terminal" and manifest["levels"] == [0, 1] and manifest["recipe"]["max_turns"] == 8
    loaded = batches.load_batch(tmp_path / "b", bid, datetime.now(timezone.utc))
    # the two good training lines, once each (num_tasks 8 does not repeat them); the held-out line never
    assert [r["task_id"] for r in loaded.tasks] == ["mine-L00001", "second"]
    assert {r["environment"] for r in loaded.tasks} == {"terminal"} and {r["source"] for r in loaded.tasks} == {str(path)}
    assert {json.loads(r["metadata"])["max_turns"] for r in loaded.tasks} == {8}
    (reject,) = loaded.rejects
    assert reject["line"] == 2 and reject["batch_id"] == bid and reject["error"].startswith(f"{path}:2: ")
    assert "leaves the task's folder" in reject["error"] and "; fix: " in reject["error"]
    # the next cycle's batch: the next slice of the same file
    bid1 = batches.register_terminal_file_batch(tmp_path / "b", path, num_tasks=1)
    bid2 = batches.register_terminal_file_batch(tmp_path / "b", path, num_tasks=1)
    rows = [batches.load_batch(tmp_path / "b", b, datetime.now(timezone.utc)).tasks for b in (bid1, bid2)]
    assert [r[0]["task_id"] for r in rows] == ["mine-L00001", "second"] and bid1 != bid2
    held = _file(tmp_path, TREE, name="held.jsonl")
    with pytest.raises(ValueError, match="no usable training task"):
        batches.register_terminal_file_batch(tmp_path / "b", held, num_tasks=1)


def test_the_benchmark_of_a_task_file_is_its_held_out_lines_or_all_of_them(tmp_path):
    from tentalis_pipelines.evaluation.benchmarks import load_benchmark

    name, items = load_benchmark(str(_file(tmp_path, GOOD, "{bad", TREE)))
    assert name == "file:mine" and [it.item_id for it in items] == ["tidy"]  # the held-out line only
    assert items[0].environment == "terminal" and items[0].extra["task"]["split"] == "test"
    _, items = load_benchmark(str(_file(tmp_path, GOOD, {**GOOD, "id": "x"}, name="all.jsonl")))
    assert [it.item_id for it in items] == ["all-L00001", "x"]  # none marked held out: every good line


def test_a_terminal_task_file_dropped_into_the_inbox_is_a_terminal_batch_of_its_training_lines(tmp_path):
    path = _file(tmp_path, {**GOOD, "level": 0}, "{bad", {**GOOD, "id": "b", "level": 0}, TREE, name="drop.jsonl")
    bid = batches.register_file_batch(tmp_path / "b", path)
    manifest = json.loads((tmp_path / "b" / bid / "manifest.json").read_text())
    assert (manifest["family"], manifest["levels"], manifest["recipe"]["max_turns"], manifest["recipe"]["temperature"]) == ("terminal", [0], 4, 0.4)
    loaded = batches.load_batch(tmp_path / "b", bid, datetime.now(timezone.utc))
    assert [r["task_id"] for r in loaded.tasks] == ["drop-L00001", "b"] and [r["line"] for r in loaded.rejects] == [2]
    math = _file(tmp_path, {"prompt": "1+1", "reference": "2"}, name="math.jsonl")  # a math file stays a jsonl batch
    assert json.loads((tmp_path / "b" / batches.register_file_batch(tmp_path / "b", math) / "manifest.json").read_text())["family"] == "jsonl"
