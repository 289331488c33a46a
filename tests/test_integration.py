"""End to end: the README's CI lines (`dagster job execute` of the asset jobs) on the real embedded
SmolLM2, and `tentalis run` driving the same jobs."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from dagster import AssetKey, DagsterInstance, DagsterRunStatus, RunsFilter

from tentalis_pipelines.lakehouse import Lakehouse
from tentalis_pipelines.promotion import decisions
from tentalis_pipelines.training.checkpoints import verify_adapter
from tentalis_pipelines.training.serving import serving_checkpoint

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tools" / "ci_cycle.sh"


def _env(tmp_path: Path, **extra) -> dict:
    dh = tmp_path / "dh"
    dh.mkdir(exist_ok=True)
    (dh / "dagster.yaml").write_text((ROOT / "dagster.yaml").read_text())
    env = {k: v for k, v in os.environ.items() if k not in ("TENTALIS_MODEL", "TENTALIS_BACKEND", "OPENAI_BASE_URL")}
    return {**env, "TENTALIS_HOME": str(tmp_path / "home"), "DAGSTER_HOME": str(dh), "BIN": str(Path(sys.executable).parent), **extra}


def test_the_readme_shows_the_ci_script_verbatim():
    body = SCRIPT.read_text().split("# --- begin README\n")[1].split("# --- end README")[0]
    assert body.count("dagster job execute") == 4 and body in (ROOT / "README.md").read_text()


@pytest.mark.integration
def test_ci_lines_run_a_full_cycle_with_the_gate_and_the_next_batch_uses_its_decision(tmp_path, embedded_model_dir):
    (tmp_path / "home" / "models").mkdir(parents=True)
    (tmp_path / "home" / "models" / embedded_model_dir.name).symlink_to(embedded_model_dir, target_is_directory=True)
    config = tmp_path / "run.yaml"
    config.write_text("resources:\n  policy: {config: {num_generations: 4, max_new_tokens: 48}}\n"
                      "  benchmark: {config: {limit: 12, max_new_tokens: 48}}\n")
    env = _env(tmp_path, RUN_CONFIG=str(config), NUM_TASKS="4", SEED="3")
    out = subprocess.run(["bash", str(SCRIPT)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, (out.stdout[-2000:], out.stderr[-4000:])
    lake = Lakehouse(tmp_path / "home" / "lakehouse")
    row = lake.read("checkpoints").to_pylist()[0]
    # DAPO's dynamic sampling (the default recipe) trains on the kept groups only: those whose rewards differ.
    kept = lake.sql("select count(*) n from trajectories where kept").to_pylist()[0]["n"]
    assert row["parent_id"] is None and 0 < row["trajectory_count"] == kept <= 16
    verify_adapter(row["adapter_uri"])
    results = {r["checkpoint_id"]: r for r in lake.read("benchmark_results").to_pylist()}
    assert set(results) == {"base", row["checkpoint_id"]} and all(r["n"] == 12 for r in results.values())
    (decision,) = decisions(lake)
    assert decision["checkpoint_id"] == row["checkpoint_id"] and decision["incumbent"] == "base" and decision["n_paired"] == 12
    expected = row["checkpoint_id"] if decision["promote"] else "base"
    assert serving_checkpoint(lake) == expected
    os.environ["DAGSTER_HOME"], saved = env["DAGSTER_HOME"], os.environ.get("DAGSTER_HOME")
    try:
        with DagsterInstance.get() as instance:
            # Every run belongs to its asset job, and the gate's check result is recorded on `serving`.
            runs = instance.get_run_records(RunsFilter(statuses=[DagsterRunStatus.SUCCESS]))
            assert sorted(r.dagster_run.job_name for r in runs) == ["benchmark_job", "benchmark_job", "promotion_job", "rollout_job", "train_job"]
            check = instance.event_log_storage.get_latest_asset_check_execution_by_key(
                [__import__("dagster").AssetCheckKey(AssetKey("serving"), "promotion_gate")])
            evaluation = next(iter(check.values())).event.dagster_event.event_specific_data
            assert evaluation.passed is decision["promote"] and evaluation.metadata["candidate"].value == row["checkpoint_id"]
    finally:
        if saved is None:
            del os.environ["DAGSTER_HOME"]
        else:
            os.environ["DAGSTER_HOME"] = saved
    # The next batch's rollouts use what the gate decided.
    more = subprocess.run([str(Path(sys.executable).parent / "tentalis"), "run", "--num-tasks", "2", "--seed", "4", "--num-generations", "2",
                           "--max-new-tokens", "16", "--no-train"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert more.returncode == 0, more.stdout[-3000:]
    versions = lake.sql("select batch_id, min(policy_version) v, count(*) n from rollouts group by 1 order by 1").to_pylist()
    assert [(v["v"], v["n"]) for v in versions] == [("base", 16), (expected, 4)]


def test_tentalis_run_is_runs_of_the_asset_jobs_tagged_with_their_cycle(tmp_path, tiny_model_dir):
    env = _env(tmp_path, TENTALIS_MODEL=str(tiny_model_dir))
    out = subprocess.run([str(Path(sys.executable).parent / "tentalis"), "run", "--num-tasks", "2", "--seed", "5", "--num-generations", "2",
                          "--max-new-tokens", "8", "--no-train"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    lake = Lakehouse(tmp_path / "home" / "lakehouse")
    assert lake.count("rollouts") == 4 and lake.count("trajectories") == 4
    assert set(lake.read("rollouts", columns=["model"]).column("model").to_pylist()) == {str(tiny_model_dir)}
    os.environ["DAGSTER_HOME"], saved = env["DAGSTER_HOME"], os.environ.get("DAGSTER_HOME")
    try:
        with DagsterInstance.get() as instance:
            (run,) = [r.dagster_run for r in instance.get_run_records()]
            assert run.job_name == "rollout_job" and run.tags["dagster/partition"] == "arith-s5-n2-l12"
            assert run.tags["tentalis/trigger"] == "cli" and run.tags["tentalis/cycle"].startswith("cycle-")
            assert json.loads(json.dumps(instance.get_dynamic_partitions("task_batches"))) == ["arith-s5-n2-l12"]
    finally:
        if saved is None:
            del os.environ["DAGSTER_HOME"]
        else:
            os.environ["DAGSTER_HOME"] = saved
