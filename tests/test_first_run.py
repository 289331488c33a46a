"""A first run on a machine without the benchmark data (any fresh clone): `make run`'s cycle completes.

With ``TENTALIS_DATA_DIR`` unset, or pointing at an empty folder, a whole cycle (tasks -> rollouts -> ...
-> checkpoint -> benchmarks -> gate) runs through the same asset jobs as `tentalis run`, on the tiny model;
the tasks asset's metadata names the benchmarks that were not screened, and why.
"""

from __future__ import annotations

import pytest
from dagster import AssetKey, DagsterInstance

from jobs.runner import CycleOptions, run_cycle
from tentalis_pipelines.definitions import defs
from tentalis_pipelines.lakehouse import Lakehouse
from tentalis_pipelines.settings import Paths


@pytest.mark.parametrize("data", ["unset", "empty"])
def test_a_first_cycle_completes_without_benchmark_data_and_names_what_was_not_screened(home, tmp_path, tiny_model_dir, monkeypatch, data):
    monkeypatch.delenv("TENTALIS_CONTAMINATION_BENCHMARKS", raising=False)
    monkeypatch.delenv("TENTALIS_MODEL", raising=False)
    if data == "unset":
        monkeypatch.delenv("TENTALIS_DATA_DIR", raising=False)
    else:
        (tmp_path / "empty-data").mkdir()
        monkeypatch.setenv("TENTALIS_DATA_DIR", str(tmp_path / "empty-data"))
    paths = Paths.from_env(str(home)).ensure()
    resources = {"policy": {"config": {"model": str(tiny_model_dir), "num_generations": 2, "max_new_tokens": 8}},
                 "benchmark": {"config": {"limit": 4, "max_new_tokens": 8}},
                 # The random tiny model gets every task wrong; the length-paying manager's scores differ within
                 # a group, so the batch carries a learning signal and the cycle trains (the subject here is data).
                 "review": {"config": {"manager": "hackable"}}}
    with DagsterInstance.ephemeral() as instance:
        instance.add_dynamic_partitions("checkpoint_ids", ["base"])  # as `tentalis init` does
        out = run_cycle(defs, instance, paths, CycleOptions(num_tasks=2, seed=11, resources=resources))
        meta = instance.get_latest_materialization_event(AssetKey("tasks")).asset_materialization.metadata

    assert [r.job for r in out["runs"]] == ["rollout_job", "train_job", "benchmark_job", "benchmark_job", "promotion_job"]
    assert out["checkpoint_id"] and out["decision"]["checkpoint_id"] == out["checkpoint_id"]
    lake = Lakehouse(paths.lakehouse)
    assert lake.count("tasks") == 2 and lake.count("trajectories") == 4 and lake.count("checkpoints") == 1
    screen = meta["contamination_screen"].value
    assert screen["screened"] == ["arithmetic", "humaneval", "terminal", "bfcl"] and set(screen["skipped"]) == {"gsm8k", "math500"}
    why = ("TENTALIS_DATA_DIR is not set" if data == "unset" else f"no file at {tmp_path / 'empty-data'}/gsm8k/test.jsonl")
    assert why in screen["skipped"]["gsm8k"] and "tentalis data fetch" in screen["skipped"]["gsm8k"]
