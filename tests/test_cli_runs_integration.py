"""`tentalis run` / `learn` with hostile settings (issue 11): the model the user named, or one clear line.

Every refusal happens before a model loads and leaves every stored row as it was.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tentalis_pipelines.cli import app
from tentalis_pipelines.lakehouse import Lakehouse
from tentalis_pipelines.settings import Paths

runner = CliRunner()


@pytest.fixture()
def cli_home(home: Path, tmp_path: Path, monkeypatch) -> Path:
    """A home with one stored row, and a Dagster instance of its own (never the developer's)."""
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster"))
    for var in ("TENTALIS_MODEL", "TENTALIS_BACKEND", "OPENAI_BASE_URL"):
        monkeypatch.delenv(var, raising=False)
    Lakehouse(Paths.from_env(home).ensure().lakehouse).quarantine([{"source": "x.jsonl", "line": 1, "raw": "{}", "error": "e"}])
    return home


def _one_clear_line(out, *needles: str) -> None:
    assert out.exit_code == 2, out.output
    assert isinstance(out.exception, SystemExit), out.exception  # typer.Exit, not a traceback
    text = " ".join(out.output.split())
    assert "Traceback" not in out.output and all(n in text for n in needles), out.output




def test_run_trains_the_model_named_by_tentalis_model(cli_home, tiny_model_dir, monkeypatch):
    """The CLI passes a partial policy config; the model must still come from $TENTALIS_MODEL."""
    monkeypatch.setenv("TENTALIS_MODEL", str(tiny_model_dir))
    monkeypatch.delenv("TENTALIS_PROGRESS", raising=False)
    out = runner.invoke(app, ["run", "--num-tasks", "2", "--num-generations", "2", "--max-new-tokens", "6", "--no-train"])
    assert out.exit_code == 0, out.output
    models = Lakehouse(Paths.from_env(cli_home).lakehouse).read("rollouts", columns=["model"]).column("model").to_pylist()
    assert len(models) == 4 and set(models) == {str(tiny_model_dir)}
    # Not a terminal (CliRunner's output, as a CI log): one line per finished stage as it ended, then the job's,
    # then the cycle's, each with its elapsed time (cli/progress.py); no bar redrawn with \r. Standard output
    # alone: transformers' loading bars on standard error end in \r, not a newline.
    lines = [line for line in out.stdout.splitlines() if line.startswith("[cycle 1/1] ") and " note: " not in line]
    took, elapsed = r"(?:\d+\.\d s|\d+:\d\d)", r" \(elapsed \d+:\d\d\)"
    ended = [re.fullmatch(rf"\[cycle 1/1\] (\w+) (?:done in {took}(?:: .+)?|skipped){elapsed}", line) for line in lines[:-1]]
    assert all(ended) and re.fullmatch(rf"\[cycle 1/1\] done in {took}{elapsed}", lines[-1]), out.output
    stages = [m.group(1) for m in ended]
    assert stages[:2] == ["tasks", "rollouts"] and {"reviews", "trajectories"} <= set(stages), out.output
    assert stages[-1] == "rollout_job" and "run " in lines[-2], out.output  # the stages first, then their job, then the cycle
    assert "\r" not in out.stdout






def test_a_failed_run_ends_in_one_line_not_a_traceback(cli_home, tiny_model_dir, tmp_path, monkeypatch):
    broken = tmp_path / "broken-model"
    broken.mkdir()
    shutil.copy(tiny_model_dir / "config.json", broken / "config.json")  # a model folder without weights
    monkeypatch.setenv("TENTALIS_MODEL", str(broken))
    out = runner.invoke(app, ["run", "--num-tasks", "1", "--num-generations", "2", "--max-new-tokens", "4", "--no-train"])
    assert out.exit_code == 1 and isinstance(out.exception, SystemExit), out.output
    text = " ".join(out.output.split())
    # The step and its own error (the tokenizer the folder lacks), not Dagster's wrapper or a traceback.
    assert "rollout_job (" in text and "tasks failed: " in text and "DagsterExecutionStepExecutionError" not in text, out.output
    # the progress line names the stage that failed, with its own error, and the cycle's end
    assert re.search(r"\[cycle 1/1\] tasks failed after \d+\.\d s: \S", text) and "[cycle 1/1] failed after" in text, out.output
    assert "CheckError" not in text and "Traceback" not in text, out.output


