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
