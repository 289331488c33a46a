"""Bring-your-own terminal tasks: a JSON Lines file, one task per line.

Each line is a JSON object (keys other than these are refused, so a typo is not silently ignored)::

    {"id": "count-errors",                       # optional: unique in the file (default: <file stem>-L<line>)
     "instruction": "How many lines of app.log hold ERROR? Submit the number.",
     "files": {"app.log": "ERROR a\\nINFO b\\nERROR c\\n", "empty/": ""},   # the initial tree (optional)
     "check": {"kind": "answer", "expected": "2"},
     "solution": ["grep -c ERROR app.log", "submit 2"],                     # optional
     "level": 1,                                  # optional, 0-99 (default 1): the curriculum's level
     "split": "train"}                            # optional: train (default) | heldout

``files`` maps a path relative to the task's working directory to its text (a path ending in ``/`` is an
empty directory, its content ``""``). ``check`` is one of:

* ``{"kind": "answer", "expected": "2"}``: the submitted answer equals ``expected`` (surrounding
  whitespace aside; a number is compared as its text);
* ``{"kind": "tree", "files": {"out.txt": "hello\\n", "keep.txt": {"exists": true}, "old.txt": {"absent":
  true}, "logs": {"dir": true}}}``: the final tree holds each file with that content (trailing newlines
  aside), each path that must exist, no path that must not, each directory.

Every line is validated on its own; a bad line is reported as ``<file>:<line>: <problem>; fix: <how>``,
goes to the ``quarantine`` table with its batch, and the good lines still become tasks. Held-out lines
are never in a training batch; ``tentalis benchmark --tasks <file>`` evaluates them (all lines when the
file marks none held out). A file with no task at all is an error of the whole file.
"""

from __future__ import annotations

import json
import math
import posixpath
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tentalis_pipelines.envs.terminal_tasks import TerminalTask
from tentalis_pipelines.tasks.jsonl import MAX_ID_CHARS, TaskRowError, check_unicode

KEYS = ("id", "instruction", "files", "check", "solution", "level", "split")
CHECK_KINDS = ("answer", "tree")
SPLITS = {"train": "train", "heldout": "test"}  # the file's word -> TerminalTask.split (the generator's "test")
MAX_LEVEL = 99
MAX_PATH_CHARS = 255
EXAMPLE = ('{"instruction": "How many lines does notes.txt have? Submit the number.", "files": {"notes.txt": "a\\nb\\n"}, '
           '"check": {"kind": "answer", "expected": "2"}}')


class TerminalFileError(ValueError):
    """The task file as a whole cannot be used (missing, unreadable, empty)."""


class LineError(TaskRowError):
    """One line is not a task: what is wrong and how to fix it."""

    def __init__(self, problem: str, fix: str):
        super().__init__(f"{problem}; fix: {fix}")
        self.problem, self.fix = problem, fix


@dataclass
class TerminalFile:
    """The tasks of a file (every good line) and its bad lines (quarantine rows without a batch id)."""

    path: Path
    tasks: list[TerminalTask] = field(default_factory=list)
    rejects: list[dict[str, Any]] = field(default_factory=list)

    @property
    def train(self) -> list[TerminalTask]:
        return [t for t in self.tasks if t.split == "train"]

    @property
    def held_out(self) -> list[TerminalTask]:
        return [t for t in self.tasks if t.split != "train"]

    def errors(self) -> list[str]:
        """``<file>:<line>: <problem>; fix: <how>`` for every bad line."""
        return [r["error"] for r in self.rejects]


def is_terminal_task_file(path: str | Path) -> bool:
    """Whether ``path`` is a terminal task file: a file whose first line that parses as a JSON object has
    an ``instruction`` (math and code task files have ``prompt``, ``question`` or ``problem``)."""
    p = Path(path).expanduser()
    if not p.is_file():
        return False
    with p.open("r", encoding="utf-8", errors="replace") as fh:
        for raw in fh:
            try:
                record = json.loads(raw)
            except ValueError:
                continue
            if isinstance(record, dict):
                return "instruction" in record
    return False


def _check_path(path: Any, where: str) -> str:
    if not isinstance(path, str) or not path.strip("/"):
        raise LineError(f"{where}: the path {path!r} is empty or not text", "name a file relative to the task's folder, e.g. \"notes.txt\"")
    if len(path) > MAX_PATH_CHARS or "\x00" in path or "\\" in path:
        raise LineError(f"{where}: the path {path[:80]!r} is too long or holds a NUL or a backslash",
                        f"use at most {MAX_PATH_CHARS} characters and '/' between folders")
    parts = path.rstrip("/").split("/")
    if path.startswith("/") or ".." in parts:
        raise LineError(f"{where}: the path {path!r} leaves the task's folder",
                        "use a relative path inside it, without a leading '/' or '..' (e.g. \"logs/app.log\")")
    if any(p in ("", ".") for p in parts) or posixpath.normpath(path.rstrip("/")) != path.rstrip("/"):
        raise LineError(f"{where}: the path {path!r} is not in its plain form", "write it without '//' or '.' parts, e.g. \"logs/app.log\"")
    return path


def _parse_files(files: Any) -> dict[str, str]:
    if files is None:
        return {}
    if not isinstance(files, dict):
        raise LineError(f"'files' must be an object of path -> text, got {type(files).__name__}",
                        'write it as {"notes.txt": "first line\\n"}')
    out = {}
    for path, content in files.items():
        _check_path(path, "'files'")
        if not isinstance(content, str):
            raise LineError(f"'files'[{path!r}]: the content must be text, got {type(content).__name__} {str(content)[:40]}",
                            "quote it as a JSON string (numbers too, e.g. \"42\\n\")")
        if path.endswith("/") and content:
            raise LineError(f"'files'[{path!r}]: a path ending in '/' is an empty folder, but it has content",
                            "give it \"\" as content, or drop the trailing '/' for a file")
        out[path] = content
    return out


def _parse_check(check: Any) -> dict:
    if check is None:
        raise LineError("no 'check': nothing would decide whether the task is solved",
                        'add "check": {"kind": "answer", "expected": "..."} or {"kind": "tree", "files": {...}}')
    if not isinstance(check, dict):
        raise LineError(f"'check' must be an object, got {type(check).__name__}", 'write {"kind": "answer", "expected": "..."}')
    kind = check.get("kind")
    if kind not in CHECK_KINDS:
        raise LineError(f"'check' kind {kind!r} is unknown", f"use one of {', '.join(CHECK_KINDS)}")
    if kind == "answer":
        expected = check.get("expected")
        if isinstance(expected, bool) or (isinstance(expected, float) and not math.isfinite(expected)):
            raise LineError(f"'check'.expected {expected!r} is not an answer", "give the expected answer as text, e.g. \"42\"")
        if isinstance(expected, int | float):
            expected = str(expected)
        if not isinstance(expected, str) or not expected.strip():
            raise LineError("'check'.expected is missing or empty", "give the answer the agent must submit, as text")
        return {"kind": "answer", "expected": expected.strip()}
    files = check.get("files")
    if not isinstance(files, dict) or not files:
        raise LineError("a tree check needs 'files': an object of path -> expected content or rule",
                        'write {"kind": "tree", "files": {"out.txt": "hello\\n", "old.txt": {"absent": true}}}')
    rules = []
    for path, want in files.items():
        _check_path(path, "'check'.files")
        if isinstance(want, str):
            rules.append({"path": path.rstrip("/"), "file": want})
        elif isinstance(want, dict) and len(want) == 1 and next(iter(want.values())) is True and next(iter(want)) in ("exists", "absent", "dir"):
            rules.append({"path": path.rstrip("/"), next(iter(want)): True})
        else:
            raise LineError(f"'check'.files[{path!r}]: {json.dumps(want)[:60]} is not a rule",
                            'give the expected text, or {"exists": true}, {"absent": true} or {"dir": true}')
    return {"kind": "tree", "rules": rules}


def parse_terminal_record(record: Any, default_id: str) -> TerminalTask:
    """One line's object as a :class:`TerminalTask`, or :class:`LineError` saying what and how to fix."""
    if not isinstance(record, dict):
        raise LineError(f"expected a JSON object, got {type(record).__name__}", f"write one task object per line, e.g. {EXAMPLE}")
    unknown = sorted(set(record) - set(KEYS))
    if unknown:
        raise LineError(f"unknown key(s) {unknown}", f"use only {', '.join(KEYS)}")
    instruction = record.get("instruction")
    if not isinstance(instruction, str) or not instruction.strip():
        raise LineError("no 'instruction' (or it is empty or not text)", "say what the agent must do, e.g. \"Count the lines of notes.txt\"")
    task_id = record.get("id", default_id)
    if isinstance(task_id, bool) or not isinstance(task_id, str | int) or not str(task_id).strip() or len(str(task_id)) > MAX_ID_CHARS:
        raise LineError(f"'id' {task_id!r} is not a usable id", f"give text of 1 to {MAX_ID_CHARS} characters, unique in the file")
    files = _parse_files(record.get("files"))
    check = _parse_check(record.get("check"))
    solution = record.get("solution", [])
    if not isinstance(solution, list) or not all(isinstance(c, str) for c in solution):
        raise LineError("'solution' must be a list of shell commands (text)", 'write ["grep -c ERROR app.log", "submit 2"], or leave it out')
    level = record.get("level", 1)
    if isinstance(level, bool) or not isinstance(level, int) or not 0 <= level <= MAX_LEVEL:
        raise LineError(f"'level' {level!r} is not a level", f"give a whole number from 0 to {MAX_LEVEL} (default 1)")
    split = record.get("split", "train")
    if split not in SPLITS:
        raise LineError(f"'split' {split!r} is unknown", "use train or heldout")
    return TerminalTask(task_id=str(task_id), level=level, family="file", instruction=instruction.strip(), tree=files, check=check,
                        solution=list(solution), split=SPLITS[split], metadata={"origin": "file"})


def read_terminal_file(path: str | Path, source: str | None = None, *, display: str | None = None) -> TerminalFile:
    """Every line of a terminal task file, validated on its own: good lines become tasks, bad lines
    quarantine rows whose ``error`` names the file (``display``, default the path), the line and the fix.
    Raises :class:`TerminalFileError` when the file is missing or holds no line at all."""
    p = Path(path).expanduser()
    shown = display or str(path)
    if not p.is_file():
        raise TerminalFileError(f"{shown}: no such task file; fix: give the path of a .jsonl file, one task per line")
    out = TerminalFile(p)
    stem = Path(source).stem if source else p.stem  # a batch's snapshot keeps the ids of the user's file
    seen: dict[str, int] = {}
    lines = 0
    with p.open("r", encoding="utf-8", errors="surrogateescape", newline="\n") as fh:
        for lineno, raw in enumerate(fh, start=1):
            text = raw.rstrip("\n").removesuffix("\r")
            if not text.strip():
                continue
            lines += 1
            try:
                if any("\udc80" <= ch <= "\udcff" for ch in text):
                    text = text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
                    raise LineError("the line is not valid UTF-8", "save the file as UTF-8")
                try:
                    record = json.loads(text)
                except (ValueError, RecursionError) as exc:
                    raise LineError(f"invalid JSON ({getattr(exc, 'msg', exc)})", f"write one JSON object per line, e.g. {EXAMPLE}") from None
                check_unicode(record)
                task = parse_terminal_record(record, f"{stem}-L{lineno:05d}")
                if task.task_id in seen:
                    raise LineError(f"duplicate id {task.task_id!r} (line {seen[task.task_id]} has it too)", "give every task its own id")
                seen[task.task_id] = lineno
            except TaskRowError as exc:
                out.rejects.append({"source": source or str(p), "line": lineno, "raw": text[:10000], "error": f"{shown}:{lineno}: {exc}",
                                    "stage": "tasks"})
                continue
            out.tasks.append(task)
    if lines == 0:
        raise TerminalFileError(f"{shown}: the file holds no task; fix: write one JSON object per line, e.g. {EXAMPLE}")
    return out
