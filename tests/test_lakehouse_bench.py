"""The lakehouse benchmarks run at tiny sizes and return complete, consistent reports (no timing asserts)."""

import pytest

from bench.lakehouse_bench import (
    SCALING_TABLES,
    aggregate_benchmark,
    batch_scaling_benchmark,
    synthetic_batch,
    synthetic_trajectories,
)
from tentalis_pipelines.lakehouse import Lakehouse, to_table
from tentalis_pipelines.schemas import SCHEMAS


def test_synthetic_rows_fit_the_real_schemas():
    t = synthetic_trajectories(1000, 7)
    assert t.schema == SCHEMAS["trajectories"] and t.num_rows == 1000
    assert len(set(t.column("batch_id").to_pylist())) == 7
    rows = synthetic_batch("b1", 8, steps=2)
    assert {k: len(v) for k, v in rows.items()} == {"tasks": 2, "rollouts": 8, "step_scores": 16, "reviews": 8, "trajectories": 8}
    for name, batch in rows.items():
        assert to_table(name, batch).num_rows == len(batch)


def test_aggregate_benchmark_at_a_tiny_size(tmp_path):
    r = aggregate_benchmark(tmp_path / "agg", rows=2000, batches=4, commits=2, compact=True, repeats=2)
    assert (r["rows"], r["batches"], r["commits"], r["files"]) == (2000, 4, 2, 4)
    assert r["rows_counted"] == 2000 and r["result_rows"] == 4  # one policy version per batch here
    assert len(r["runs_seconds"]) == 3 and r["cold_seconds"] == r["runs_seconds"][0]
    assert r["best_seconds"] == min(r["runs_seconds"][1:]) and r["write_seconds"] > 0
    assert r["compaction"]["files_after"] == 4  # one file per batch partition already
    assert Lakehouse(tmp_path / "agg").table("trajectories").metadata().partition_columns == ["batch_id"]
    with pytest.raises(ValueError, match="already holds"):
        aggregate_benchmark(tmp_path / "agg", rows=10, batches=1)


def test_batch_scaling_benchmark_at_a_tiny_size(tmp_path):
    r = batch_scaling_benchmark(tmp_path / "scale", batch_rows=8, batches=3, repeats=2)
    assert (r["batch_n"], r["repeats"], len(r["first_write_seconds"]), r["first_write_ratio"]) == (3, 2, 3, None)
    assert r["batch_1_seconds"] > 0 and r["ratio"] == pytest.approx(r["batch_n_seconds"] / r["batch_1_seconds"], rel=0.01)
    assert len(r["batch_1_runs"]) == len(r["batch_n_runs"]) == 2
    assert set(r["stage_seconds_batch_n"]) == set(SCALING_TABLES)
    # Re-materialising replaced batches: every table holds exactly 3 batches' rows.
    assert r["rows"] == {t: 3 * n for t, n in r["rows_per_batch"].items()}
