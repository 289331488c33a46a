"""Delta tables: a re-run of a batch replaces its rows; bad input is refused without damage."""

import re
from datetime import datetime, timezone

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from tentalis_pipelines import schemas
from tentalis_pipelines.lakehouse import Lakehouse, LakehouseError
from tentalis_pipelines.schemas import SCHEMAS, column_descriptions, table_description


def _task(batch, i):
    return {"batch_id": batch, "task_id": f"t{i}", "source": "test", "environment": "math", "prompt": f"{i}+1?",
            "reference": str(i + 1), "difficulty": 1, "metadata": "{}", "created_at": datetime.now(timezone.utc)}


def test_every_column_of_every_table_is_described():
    """The schema is the data contract: each column says what it means (the Dagster UI shows it)."""
    for name, schema in SCHEMAS.items():
        described = column_descriptions(name)
        assert list(described) == schema.names, name
        assert all(text.strip() for text in described.values()), (name, [c for c, t in described.items() if not t.strip()])
        assert table_description(name).strip(), name
        # The UI renders descriptions as Markdown, where a bare <answer> would vanish as an HTML tag.
        tags = [c for c, text in described.items() if re.search(r"</?[A-Za-z][^>]*>", re.sub(r"`[^`]*`", "", text))]
        assert not tags, f"{name}: put the <tags> of {tags} in backticks"


def test_the_descriptions_of_the_former_row_models_are_carried():
    """The texts that the pydantic row models held, word for word (a few of the 144)."""
    assert column_descriptions("rollouts")["policy_version"] == "checkpoint id that sampled it, or 'base'"
    assert column_descriptions("tasks")["environment"] == "math | code | chat"
    assert column_descriptions("trajectories")["reward_version"] == (
        "the reward version whose rewards and advantages the row carries (`tentalis rescore`); null = the pipeline's own (v0)")
    assert column_descriptions("teacher_logprobs")["decision"] == "used | no_hint | trivial | leaks_answer | no_effect"
    assert column_descriptions("serving")["seq"] == "position in the serving log; the row with the highest seq is what serves"
    assert column_descriptions("audit")["action"] == (
        "promote | rollback | gate | reconcile | migrate | retract (serving moves), gate_decision, retraction")
    assert column_descriptions("skills")["embedding"] == "all-MiniLM-L6-v2 embedding of the text (unit length)"
    assert column_descriptions("judge_agreement")["spearman"] == (
        "Spearman rank correlation (average ranks for ties); null when either side is constant")


def _plain(schema: pa.Schema) -> pa.Schema:
    return pa.schema([pa.field(f.name, f.type, f.nullable) for f in schema])


def _described(schema: pa.Schema, text: str) -> pa.Schema:
    return pa.schema([pa.field(f.name, f.type, f.nullable, metadata={"description": f"{text} {f.name}"}) for f in schema])


def _delta_descriptions(lake, name):
    return {f.name: dict(f.metadata or {}) for f in lake.table(name).schema().fields if f.metadata}


@pytest.mark.parametrize("created_with", ["plain", "other_descriptions"])
def test_a_table_created_before_the_descriptions_takes_every_write(tmp_path, created_with):
    """A tasks table that an older Tentalis created (no descriptions; or descriptions that differ from
    today's, which delta-rs would refuse to merge) takes writes of every kind: the rows land, none is lost."""
    lake = Lakehouse(tmp_path / "lh")
    old = _plain(SCHEMAS["tasks"]) if created_with == "plain" else _described(SCHEMAS["tasks"], "an older text for")
    write_deltalake(lake.uri("tasks"), pa.Table.from_pylist([_task("b1", i) for i in range(3)], schema=old),
                    mode="append", partition_by=["batch_id"])
    stored = _delta_descriptions(lake, "tasks")

    lake.write_batch("tasks", "b2", [_task("b2", i) for i in range(2)])  # a new partition
    lake.write_batch("tasks", "b1", [_task("b1", i) for i in range(4)])  # replaces b1
    lake.append("tasks", [_task("b3", 0)])
    lake.upsert("tasks", ["batch_id", "task_id"], [{**_task("b3", 0), "prompt": "changed"}, _task("b3", 1)], compare=["prompt"])
    lake.replace_in("tasks", "batch_id", ["b4"], [_task("b4", 0)])

    assert {b: lake.count("tasks", batch_id=b) for b in ("b1", "b2", "b3", "b4")} == {"b1": 4, "b2": 2, "b3": 2, "b4": 1}
    rows = {(r["batch_id"], r["task_id"]): r for r in lake.read("tasks").to_pylist()}
    assert rows[("b3", "t0")]["prompt"] == "changed" and rows[("b1", "t3")]["reference"] == "4"
    assert lake.read("tasks").schema.names == SCHEMAS["tasks"].names
    assert _delta_descriptions(lake, "tasks") == stored  # the table's own schema is left as it was


def test_editing_a_description_never_breaks_an_existing_table(tmp_path, monkeypatch):
    """The Delta tables carry no descriptions, so a reworded description writes like before."""
    lake = Lakehouse(tmp_path / "lh")
    lake.write_batch("tasks", "b1", [_task("b1", i) for i in range(2)])
    lake.append("quarantine", [{"source": "f", "line": 1, "raw": "{", "error": "e", "batch_id": "b1", "stage": "tasks",
                                "seen_at": datetime.now(timezone.utc)}])
    assert _delta_descriptions(lake, "tasks") == {} and _delta_descriptions(lake, "quarantine") == {}

    for name in ("tasks", "quarantine"):
        monkeypatch.setitem(schemas.SCHEMAS, name, _described(SCHEMAS[name], "reworded:"))
    assert column_descriptions("tasks")["prompt"] == "reworded: prompt"
    lake.write_batch("tasks", "b1", [_task("b1", i) for i in range(3)])
    lake.write_batch("tasks", "b2", [_task("b2", 0)])
    lake.quarantine([{"source": "f", "line": 2, "raw": "{", "error": "e", "batch_id": "b1", "stage": "tasks"}],
                    batch_id="b1", stage="tasks")
    assert lake.count("tasks") == 4 and lake.count("quarantine") == 1


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
