"""`tentalis run` / `learn` with hostile settings (issue 11): the model the user named, or one clear line.

Every refusal happens before a model loads and leaves every stored row as it was.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from table_hashes import assert_unchanged, table_hashes
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


def test_a_missing_model_fails_in_one_line_naming_the_setting(cli_home, monkeypatch):
    before = table_hashes(Paths.from_env(cli_home).lakehouse)
    monkeypatch.setenv("TENTALIS_MODEL", "/nonexistent")
    for args in (["run", "--num-tasks", "1"], ["learn", "--cycles", "1"]):
        _one_clear_line(runner.invoke(app, args), "TENTALIS_MODEL=/nonexistent", "local Hugging Face model folder")
    assert_unchanged(Paths.from_env(cli_home).lakehouse, before)


def test_openai_backend_without_a_server_url_is_refused(cli_home, monkeypatch):
    monkeypatch.setenv("TENTALIS_BACKEND", "openai")
    _one_clear_line(runner.invoke(app, ["run"]), "OPENAI_BASE_URL")
    _one_clear_line(runner.invoke(app, ["run", "--backend", "llama"]), "backend 'llama' is unknown")


@pytest.mark.parametrize("args, needle", [
    (["run", "--num-generations", "-2"], "--num-generations"),
    (["run", "--max-new-tokens", "-5"], "--max-new-tokens"),
    (["run", "--num-tasks", "0"], "--num-tasks"),
    (["run", "--seed", "1000000"], "seed 1000000 is reserved"),
    (["run", "--progress", "sparkle"], "--progress 'sparkle': choose auto, lines, bar, none"),
    (["learn", "--progress", "loud"], "--progress 'loud': choose auto, lines, bar, none"),
    (["learn", "--cycles", "0"], "--cycles"),
    (["learn", "--num-generations", "1"], "--num-generations"),
    (["learn", "--levels", "x"], "--levels 'x'"),
    (["learn", "--learning-rate", "0"], "--learning-rate"),
    (["learn", "--loss-type", "ppo"], "--loss-type 'ppo'"),
    (["learn", "--skills", "--skills-top-k", "0"], "--skills-top-k"),
    (["learn", "--step-scorer", "oracle"], "--step-scorer 'oracle'"),
    (["learn", "--step-scorer", "prm_head"], "tentalis prm train"),  # no head trained in this home
    (["learn", "--advantage-mode", "steps"], "--advantage-mode 'steps'"),
    (["learn", "--method", "guide", "--guide-rescue", "demo"], "--guide-rescue 'demo'"),
    (["learn", "--reward-weights", '{"manger": 0}'], "--reward-weights: unknown reward component 'manger'"),
    (["learn", "--reward-weights", "{manager: 0}"], "--reward-weights: not valid JSON"),
    (["learn", "--manager", "llm", "--hint-prefix", 'Say "add'], "--hint-prefix: hint_prefix 'Say \"add' holds a quote"),
    (["manager", "train", "--hint-prefix", "Add\\"], "hint_prefix 'Add\\\\' holds a quote or a backslash"),
])
def test_nonsense_numbers_are_refused_up_front(cli_home, args, needle):
    before = table_hashes(Paths.from_env(cli_home).lakehouse)
    _one_clear_line(runner.invoke(app, args), needle)
    assert_unchanged(Paths.from_env(cli_home).lakehouse, before)


def test_an_unusable_home_is_one_clear_line(tmp_path, monkeypatch):
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster"))
    (tmp_path / "file").write_text("not a folder")
    _one_clear_line(runner.invoke(app, ["status", "--home", str(tmp_path / "file" / "home")]), "is not usable", "TENTALIS_HOME")


def test_learn_hands_its_step_scorer_and_advantage_mode_to_every_cycle(cli_home, monkeypatch):
    """`learn --step-scorer prm_head --advantage-mode process` reaches each cycle's review and trainer config
    (the cycle itself is recorded here, not run)."""
    import tentalis_pipelines.cli.cycle as cycle

    head = cli_home / "reviewers" / "prm_head" / "v0001"
    head.mkdir(parents=True)
    (head / "manifest.json").write_text("{}")  # a stored version: what `learn` checks before any cycle
    seen = []
    monkeypatch.setattr(cycle, "_execute_cycle", lambda opts, label: seen.append(opts) or {})
    monkeypatch.setattr("tentalis_pipelines.promotion.benchmark_history", lambda *a, **k: {"history": ""})
    out = runner.invoke(app, ["learn", "--cycles", "2", "--step-scorer", "prm_head", "--advantage-mode", "process",
                              "--reward-weights", '{"manager": 0}', "--hint-prefix", "First compute", "--home", str(cli_home)])
    assert out.exit_code == 0, out.output
    assert len(seen) == 2
    for opts in seen:
        assert opts.resources["review"]["config"]["step_scorer"] == "prm_head"
        assert opts.resources["review"]["config"]["hint_prefix"] == "First compute"
        assert opts.resources["review"]["config"]["reward_weights"] == '{"manager": 0}'
        assert opts.resources["trainer"]["config"]["advantage_mode"] == "process"
    # a newer head that reads the model's surprise is refused before any cycle, with the fix named
    surprise = cli_home / "reviewers" / "prm_head" / "v0002"
    surprise.mkdir()
    (surprise / "manifest.json").write_text('{"config": {"features": "surprise"}}')
    seen.clear()
    out = runner.invoke(app, ["learn", "--cycles", "1", "--step-scorer", "prm_head", "--home", str(cli_home)])
    assert out.exit_code != 0 and not seen
    assert "v0002 reads the model's own surprise" in " ".join(out.output.split()) and "--features hidden" in out.output


def test_learn_guide_on_terminal_hands_the_rescue_to_every_cycle(cli_home, monkeypatch):
    """`learn --tasks terminal --method guide --guide-rescue prefix` turns guidance on with the expert prefix
    (the cycle itself is recorded here, not run)."""
    import tentalis_pipelines.cli.cycle as cycle

    seen = []
    monkeypatch.setattr(cycle, "_execute_cycle", lambda opts, label: seen.append(opts) or {})
    monkeypatch.setattr("tentalis_pipelines.promotion.benchmark_history", lambda *a, **k: {"history": ""})
    out = runner.invoke(app, ["learn", "--cycles", "1", "--tasks", "terminal", "--method", "guide", "--guide-rescue", "prefix",
                              "--home", str(cli_home)])
    assert out.exit_code == 0, out.output
    [opts] = seen
    trainer = opts.resources["trainer"]["config"]
    assert trainer["guide"] is True and trainer["guide_rescue"] == "prefix"


def test_manager_train_warns_when_the_accepted_answers_run_short():
    from tentalis_pipelines.cli.manager import accepted_shortfall

    assert accepted_shortfall({"accepted": 32, "accepted_wanted": 32}, 1.0) is None
    assert accepted_shortfall({"accepted": 9, "accepted_wanted": 8}, 0.25) is None
    msg = accepted_shortfall({"accepted": 3, "accepted_wanted": 32}, 1.0)
    assert "only 3 fresh accepted rollouts" in msg and "the 32 that --success-share 1.0" in msg and "tentalis run --no-train" in msg


def test_manager_train_hands_the_managers_temperature_and_prefix_to_its_config(cli_home, monkeypatch):
    """`--manager-temperature` is the manager's sampling temperature (ManagerRLConfig.temperature), not the
    worker's (`--temperature`, PolicySettings); `--hint-prefix` reaches the config too."""
    import json

    import tentalis_pipelines.stages.manager_training as mt

    seen = []

    def fake_train(lake, paths, policy, config, **kw):
        seen.append((policy, config))
        return {"checkpoint_id": "m-x", "parent_id": None, "metrics": json.dumps({
            "reward_mean": 0.0, "usable_hint_share": 1.0, "rescue_rate": None, "score_error": 0.0, "accepted": 8, "accepted_wanted": 8})}

    monkeypatch.setattr(mt, "train_manager", fake_train)
    out = runner.invoke(app, ["manager", "train", "--manager-temperature", "0.6", "--temperature", "0.9", "--hint-prefix", "First compute",
                              "--home", str(cli_home)])
    assert out.exit_code == 0, out.output
    (policy, config), = seen
    assert config.temperature == 0.6 and policy.temperature == 0.9 and config.hint_prefix == "First compute"


def test_manager_train_hands_best_of_n_and_its_steps_to_the_config_and_refuses_an_unknown_update(cli_home, monkeypatch):
    import json

    import tentalis_pipelines.stages.manager_training as mt

    seen = []

    def fake_train(lake, paths, policy, config, **kw):
        seen.append(config)
        return {"checkpoint_id": "m-x", "parent_id": None, "metrics": json.dumps({
            "reward_mean": 0.0, "usable_hint_share": 1.0, "rescue_rate": None, "score_error": 0.0, "accepted": 8, "accepted_wanted": 8,
            "update": "best_of_n", "hint_demonstrations": 5, "score_demonstrations": 6})}

    monkeypatch.setattr(mt, "train_manager", fake_train)
    out = runner.invoke(app, ["manager", "train", "--update", "best_of_n", "--best-min-value", "0.7", "--num-iterations", "3",
                              "--per-step-rows", "8", "--home", str(cli_home)])
    assert out.exit_code == 0, out.output
    assert "demonstrations 5 hints and 6 scores" in out.output
    (config,) = seen
    assert (config.update, config.best_min_value, config.num_iterations, config.per_step_rows) == ("best_of_n", 0.7, 3, 8)
    out = runner.invoke(app, ["manager", "train", "--update", "sft", "--home", str(cli_home)])
    assert out.exit_code != 0 and "manager update 'sft' is unknown" in out.output and len(seen) == 1


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
