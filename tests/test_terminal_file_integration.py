"""The test of ``tests/unit/test_terminal_file.py`` that costs more CPU than the unit tier allows
(tests/cpu_budget.py): ``tentalis batch new`` with a task file, through the CLI and a Dagster instance
(about 2 s of CPU in a fresh process). Moved here unchanged; the unit file keeps the rest, and the copy of
its two helpers below is theirs."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from tentalis_pipelines.cli import app

GOOD = {"instruction": "How many lines does notes.txt have? Submit the number.", "files": {"notes.txt": "a\nb\n"},
        "check": {"kind": "answer", "expected": "2"}}


def _file(tmp_path: Path, *lines: object, name: str = "mine.jsonl") -> Path:
    path = tmp_path / name
    path.write_text("".join((ln if isinstance(ln, str) else json.dumps(ln)) + "\n" for ln in lines))
    return path


def test_batch_new_with_a_task_file_reports_file_line_and_fix_and_registers_the_good_lines(home, tmp_path, monkeypatch):
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster"))
    path = _file(tmp_path, GOOD, {**GOOD, "files": {"n.txt": 3}})
    out = CliRunner().invoke(app, ["batch", "new", "--tasks", str(path), "--num-tasks", "4"])
    assert out.exit_code == 0, out.output
    text = " ".join(out.output.split())
    assert f"{path}:2: 'files'['n.txt']: the content must be text" in text and "fix: quote it as a JSON string" in text
    batch_id = out.output.strip().splitlines()[-1]
    assert batch_id.startswith("mine-") and (home / "batches" / batch_id / "manifest.json").exists()
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    bad = CliRunner().invoke(app, ["batch", "new", "--tasks", str(empty)])
    assert bad.exit_code == 2 and "the file holds no task" in " ".join(bad.output.split())
