"""End to end on the real embedded SmolLM2 and through the `dagster job execute` CLI."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from dagster import DagsterInstance

from tentalis_pipelines.definitions import defs
from tentalis_pipelines.lakehouse import Lakehouse
from tentalis_pipelines.settings import Paths
from tentalis_pipelines.training.checkpoints import verify_adapter
from tentalis_pipelines.training.serving import serving_checkpoint

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.integration
def test_learning_cycle_on_embedded_model_trains_and_next_rollouts_use_the_checkpoint(home, embedded_model_dir, monkeypatch):
    # Reuse the converted model: the cycle resolves 'embedded' under $TENTALIS_HOME/models.
    paths = Paths.from_env(home).ensure()
    (paths.models / embedded_model_dir.name).symlink_to(embedded_model_dir, target_is_directory=True)
    job = defs.get_job_def("learning_cycle_job")
    small = {"resources": {"policy": {"config": {"num_generations": 4, "max_new_tokens": 48}},
                           "bench": {"config": {"limit": 12, "max_new_tokens": 48}}}}

    def cycle(seed: int, train: bool):
        cfg = {"num_tasks": 4, "seed": seed, "levels": [1], "train": train}
        return {**small, "ops": {"register_batch": {"config": cfg}, "train_policy": {"config": cfg}}}

    with DagsterInstance.ephemeral() as instance:
        assert job.execute_in_process(run_config=cycle(3, True), instance=instance).success
        lake = Lakehouse(paths.lakehouse)
        row = lake.read("checkpoints").to_pylist()[0]
        assert row["parent_id"] is None and row["trajectory_count"] == 16
        verify_adapter(row["adapter_uri"])
        # The gate benchmarked the base model and the checkpoint on the same held-out items and decided.
        results = {r["checkpoint_id"]: r for r in lake.read("benchmark_results").to_pylist()}
        assert set(results) == {"base", row["checkpoint_id"]} and all(r["n"] == 12 for r in results.values())
        from tentalis_pipelines.pipeline import decide_promotion

        _, decision = decide_promotion(lake, row["checkpoint_id"], "arithmetic", apply=False)
        assert row["promoted"] is decision.promote
        expected = serving_checkpoint(lake)
        assert job.execute_in_process(run_config=cycle(4, False), instance=instance).success
        versions = lake.sql("select batch_id, min(policy_version) v, count(*) n from rollouts group by 1 order by 1").to_pylist()
        assert [(v["v"], v["n"]) for v in versions] == [("base", 16), (expected, 16)]
        assert len(instance.get_dynamic_partitions("task_batches")) == 2


def test_dagster_job_execute_runs_the_cycle_from_the_command_line(tmp_path, tiny_model_dir):
    config = tmp_path / "run.yaml"
    config.write_text(
        "ops:\n  register_batch: {config: {num_tasks: 2, seed: 5, train: false}}\n"
        "  train_policy: {config: {num_tasks: 2, seed: 5, train: false}}\n"
        "resources:\n  policy: {config: {num_generations: 2, max_new_tokens: 8}}\n"
    )
    env = {**os.environ, "TENTALIS_HOME": str(tmp_path / "home"), "DAGSTER_HOME": str(tmp_path / "dh"), "TENTALIS_MODEL": str(tiny_model_dir)}
    (tmp_path / "dh").mkdir()
    (tmp_path / "dh" / "dagster.yaml").write_text((ROOT / "dagster.yaml").read_text())
    out = subprocess.run(
        [str(Path(sys.executable).parent / "dagster"), "job", "execute", "-m", "tentalis_pipelines.definitions", "-j", "learning_cycle_job", "-c", str(config)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    lake = Lakehouse(tmp_path / "home" / "lakehouse")
    assert lake.count("rollouts") == 4 and lake.count("trajectories") == 4
    # run.yaml sets only some policy fields: the model still comes from $TENTALIS_MODEL (issue 11).
    assert set(lake.read("rollouts", columns=["model"]).column("model").to_pylist()) == {str(tiny_model_dir)}
