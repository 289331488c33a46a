"""Delta tables: a re-run of a batch replaces its rows; bad input is refused without damage."""

from datetime import datetime, timezone

import pytest

from tentalis_pipelines.lakehouse import Lakehouse, LakehouseError
from tentalis_pipelines.schemas import ROW_MODELS, SCHEMAS


def _task(batch, i):
    return {"batch_id": batch, "task_id": f"t{i}", "source": "test", "environment": "math", "prompt": f"{i}+1?",
            "reference": str(i + 1), "difficulty": 1, "metadata": "{}", "created_at": datetime.now(timezone.utc)}


def test_schemas_and_row_models_agree():
    for name, schema in SCHEMAS.items():
        assert list(ROW_MODELS[name].model_fields) == schema.names, name


def test_rewriting_a_batch_replaces_only_that_batch(tmp_path):
    lake = Lakehouse(tmp_path / "lh")
    lake.write_batch("tasks", "b1", [_task("b1", i) for i in range(5)])
    lake.write_batch("tasks", "b2", [_task("b2", i) for i in range(3)])
    lake.write_batch("tasks", "b1", [_task("b1", i) for i in range(5)])
    assert lake.count("tasks") == 8
    lake.write_batch("tasks", "b1", [_task("b1", i) for i in range(2)])
    assert lake.count("tasks", batch_id="b1") == 2
    assert lake.count("tasks", batch_id="b2") == 3
    con = lake.duckdb()
    assert con.execute("select count(*) from tasks where batch_id = 'b2'").fetchone()[0] == 3


def test_bad_input_is_refused_and_existing_rows_survive(tmp_path):
    lake = Lakehouse(tmp_path / "lh")
    lake.write_batch("tasks", "b1", [_task("b1", i) for i in range(3)])
    with pytest.raises(LakehouseError, match="invalid batch_id"):
        lake.write_batch("tasks", "b1'; drop", [])
    with pytest.raises(LakehouseError, match="other batch_id values"):
        lake.write_batch("tasks", "b1", [_task("b2", 0)])
    bad = _task("b1", 0)
    bad["difficulty"] = "hard"
    with pytest.raises(LakehouseError, match="do not fit its schema"):
        lake.write_batch("tasks", "b1", [bad])
    with pytest.raises(LakehouseError, match="unknown table"):
        lake.read("nope")
    assert lake.count("tasks") == 3


def test_quarantine_replaces_a_batch_stage_on_rerun(tmp_path):
    lake = Lakehouse(tmp_path / "lh")
    rej = [{"source": "f.jsonl", "line": 2, "raw": "{", "error": "invalid JSON", "batch_id": "b1", "stage": "tasks"}]
    lake.quarantine(rej, batch_id="b1", stage="tasks")
    lake.quarantine(rej, batch_id="b1", stage="tasks")
    lake.quarantine([{**rej[0], "batch_id": "b2"}], batch_id="b2", stage="tasks")
    assert lake.count("quarantine") == 2


def test_empty_tables_are_queryable_before_first_write(tmp_path):
    lake = Lakehouse(tmp_path / "lh")
    assert lake.sql("select count(*) as n from trajectories").to_pylist() == [{"n": 0}]


def _break_files_of(lake, name, batches):
    """Overwrite the data files of other batches with garbage: any read of them would now fail."""
    from pathlib import Path

    for b in batches:
        for f in (Path(lake.uri(name)) / f"batch_id={b}").glob("*.parquet"):
            f.write_bytes(b"not parquet")


def test_one_batch_is_read_and_replaced_from_its_own_partition_only(tmp_path):
    lake = Lakehouse(tmp_path / "lh")
    for b, n in (("b1", 4), ("b2", 3), ("b3", 5)):
        lake.write_batch("tasks", b, [_task(b, i) for i in range(n)])
    ds = lake.dataset("tasks", batch_id="b2")
    assert ds.files and all(f.startswith("batch_id=b2/") for f in ds.files)
    assert len(lake.dataset("tasks").files) == 3

    _break_files_of(lake, "tasks", ["b1", "b3"])
    assert sorted(r["task_id"] for r in lake.read("tasks", batch_id="b2").to_pylist()) == ["t0", "t1", "t2"]
    assert lake.read("tasks", batch_id="b2", columns=["task_id"]).column_names == ["task_id"]
    # Counting and replacing one batch never open another batch's file either.
    assert (lake.count("tasks", batch_id="b2"), lake.count("tasks")) == (3, 12)
    lake.write_batch("tasks", "b2", [_task("b2", i) for i in range(2)])
    lake.write_batch("tasks", "b4", [_task("b4", 0)])
    assert lake.count("tasks", batch_id="b2") == 2 and lake.count("tasks") == 12
    # Views are lazy: creating them reads nothing, and a batch filter prunes the broken partitions.
    con = lake.duckdb()
    assert con.execute("select count(*) from tasks where batch_id = 'b2'").fetchone()[0] == 2
    assert lake.sql("select count(*) as n from tasks where batch_id in ('b2', 'b4')").to_pylist() == [{"n": 3}]


def test_batch_filter_on_an_unpartitioned_table_is_exact(tmp_path):
    lake = Lakehouse(tmp_path / "lh")
    lake.append("quarantine", [{"source": "f", "line": i, "raw": "{", "error": "e", "batch_id": b, "stage": "tasks",
                                "seen_at": datetime.now(timezone.utc)} for i, b in enumerate(["b1", "b2", "b1"])])
    assert [r["line"] for r in lake.read("quarantine", batch_id="b1").to_pylist()] == [0, 2]
    assert lake.count("quarantine", batch_id="b1") == 2
    with pytest.raises(LakehouseError, match="no batch_id column"):
        lake.read("checkpoints", batch_id="b1")


def test_clearing_an_empty_stage_adds_no_commit(tmp_path):
    lake = Lakehouse(tmp_path / "lh")
    lake.quarantine([], batch_id="b1", stage="tasks")
    assert not lake.exists("quarantine")
    lake.quarantine([{"source": "f", "line": 1, "raw": "{", "error": "e", "batch_id": "b1", "stage": "tasks"}],
                    batch_id="b1", stage="tasks")
    version = lake.table("quarantine").version()
    lake.quarantine([], batch_id="b2", stage="tasks")  # nothing to clear: no commit
    assert lake.table("quarantine").version() == version
    lake.quarantine([], batch_id="b1", stage="tasks")  # clears b1's rejects
    assert lake.count("quarantine") == 0


def test_per_batch_tables_are_partitioned_however_they_are_created(tmp_path):
    lake = Lakehouse(tmp_path / "lh")
    lake.append("tasks", [_task("b1", 0)])
    lake.write_batch("rollouts", "b1", [])  # an empty first write creates nothing
    assert not lake.exists("rollouts")
    dt = lake.table("tasks")
    assert dt.metadata().partition_columns == ["batch_id"]
    assert dt.metadata().configuration["delta.checkpointInterval"] == "10"
