"""Maintenance: compaction, vacuum and checkpoints change files, never rows; the Dagster job and the CLI."""

import json
from datetime import datetime, timezone
from pathlib import Path

import pytest
from dagster import DagsterInstance
from deltalake import DeltaTable
from typer.testing import CliRunner

from tentalis_pipelines.lakehouse import Lakehouse, LakehouseError, table_properties
from tentalis_pipelines.settings import Paths


def _task(batch, i):
    return {"batch_id": batch, "task_id": f"t{i}", "source": "test", "environment": "math", "prompt": f"{i}+1?",
            "reference": str(i + 1), "difficulty": 1, "metadata": "{}", "created_at": datetime.now(timezone.utc)}


def _reject(batch, i):
    return {"source": "f.jsonl", "line": i, "raw": "{", "error": "invalid JSON", "batch_id": batch, "stage": "tasks",
            "seen_at": datetime.now(timezone.utc)}


def _rows(lake, name):
    key = "task_id" if name == "tasks" else "line"
    return sorted(lake.read(name).to_pylist(), key=lambda r: (r["batch_id"], r[key]))


def _fragmented(root) -> Lakehouse:
    """tasks: 2 batches, 6 appends each (12 small files); quarantine: 8 appends (8 files)."""
    lake = Lakehouse(root)
    for k in range(6):
        lake.append("tasks", [_task(b, 10 * k + i) for b in ("b1", "b2") for i in range(3)])
    for k in range(8):
        lake.append("quarantine", [_reject("b1" if k % 2 else "b2", k)])
    return lake


def test_maintenance_compacts_small_files_and_keeps_every_row(tmp_path):
    lake = _fragmented(tmp_path / "lh")
    before = {t: _rows(lake, t) for t in ("tasks", "quarantine")}
    assert lake.stats("tasks")["files"] == 12 and lake.stats("quarantine")["files"] == 8
    old_version = lake.table("tasks").version()

    reports = {r["table"]: r for r in lake.maintain_all()}

    assert set(reports) == {"tasks", "quarantine"}
    tasks, quarantine = reports["tasks"], reports["quarantine"]
    assert (tasks["files_before"], tasks["files_after"]) == (12, 2)  # one file per batch partition
    assert (quarantine["files_before"], quarantine["files_after"]) == (8, 1)
    for r in reports.values():
        assert r["rows_before"] == r["rows_after"] > 0
        assert r["bytes_after"] > 0 and r["checkpoint_version"] == r["version_after"]
        assert r["vacuumed_files"] == 0  # the compacted-away files are younger than the retention
    assert {t: _rows(lake, t) for t in before} == before
    assert lake.count("tasks", batch_id="b1") == 18
    # Compaction kept the old files: time travel to the version before it still reads every row.
    assert DeltaTable(lake.uri("tasks"), version=old_version).to_pyarrow_table().num_rows == 36
    log = Path(lake.uri("tasks")) / "_delta_log"
    assert list(log.glob("*.checkpoint.parquet"))
    assert all(DeltaTable(lake.uri(t)).metadata().configuration.get(k) == v
               for t in reports for k, v in table_properties(t).items())
    # Idempotent: a second run has nothing left to compact.
    again = lake.maintain("tasks")
    assert again["files_compacted"] == 0 and again["files_after"] == 2 and again["rows_after"] == 36


def test_vacuum_refuses_a_retention_below_the_safe_minimum_without_the_flag(tmp_path, monkeypatch):
    lake = _fragmented(tmp_path / "lh")
    with pytest.raises(LakehouseError, match="safe minimum of 168 h"):
        lake.vacuum("tasks", 0)
    with pytest.raises(LakehouseError, match="safe minimum"):
        lake.maintain("tasks", retention_hours=24)
    assert lake.stats("tasks")["files"] == 12  # refused before anything was rewritten
    monkeypatch.setenv("TENTALIS_VACUUM_RETENTION_HOURS", "1")
    with pytest.raises(LakehouseError, match="below Delta's safe minimum"):
        lake.vacuum("tasks")

    monkeypatch.delenv("TENTALIS_VACUUM_RETENTION_HOURS")
    old_version = lake.table("tasks").version()
    report = lake.maintain("tasks", retention_hours=0, allow_unsafe_retention=True)
    assert report["vacuumed_files"] == report["files_compacted"] == 12
    assert report["rows_after"] == report["rows_before"] == 36
    assert len(list(Path(lake.uri("tasks")).rglob("*.parquet"))) - len(list((Path(lake.uri("tasks")) / "_delta_log").glob("*.parquet"))) == 2
    # Only vacuum may cost time travel, and here it did: the old files are gone.
    with pytest.raises(Exception):  # noqa: B017 - delta-rs/pyarrow raise different errors for a missing file
        DeltaTable(lake.uri("tasks"), version=old_version).to_pyarrow_table()


def test_zorder_rewrites_an_unpartitioned_table_without_losing_rows(tmp_path):
    lake = _fragmented(tmp_path / "lh")
    before = _rows(lake, "quarantine")
    report = lake.maintain("quarantine", zorder=True)
    assert report["zorder_by"] == ["batch_id", "stage"]
    assert report["files_after"] == 1 and _rows(lake, "quarantine") == before
    with pytest.raises(LakehouseError, match="no column"):
        lake.optimize("tasks", zorder_by=["nope"])


def test_cli_maintain(home):
    from tentalis_pipelines.cli import app

    _fragmented(Paths.from_env(home).ensure().lakehouse)
    runner = CliRunner()
    refused = runner.invoke(app, ["maintain", "--retention-hours", "1"])
    assert refused.exit_code == 2 and "safe minimum" in refused.output
    out = runner.invoke(app, ["maintain", "--table", "tasks", "--format", "json"])
    assert out.exit_code == 0, out.output
    [report] = json.loads(out.stdout)
    assert (report["table"], report["files_before"], report["files_after"], report["rows_after"]) == ("tasks", 12, 2, 36)
    shown = runner.invoke(app, ["maintain"])
    assert shown.exit_code == 0 and "quarantine" in shown.output and "8 → 1" in shown.output


def test_vacuum_deletes_orphans_only_past_the_retention(tmp_path):
    import os
    import time

    lake = _fragmented(tmp_path / "lh")
    part = Path(lake.uri("tasks")) / "batch_id=b1"
    young, old = part / "orphan-young.parquet", part / "orphan-old.parquet"
    young.write_bytes(b"left by a writer that lost a commit race")
    old.write_bytes(b"left by a writer that lost a commit race")
    past = time.time() - 200 * 3600
    os.utime(old, (past, past))
    assert lake.vacuum("tasks", dry_run=True) == ["batch_id=b1/orphan-old.parquet"] and old.exists()
    assert lake.vacuum("tasks") == ["batch_id=b1/orphan-old.parquet"]
    assert young.exists() and not old.exists() and lake.count("tasks") == 36


def test_maintain_lakehouse_job_on_an_ephemeral_instance(home):
    from tentalis_pipelines.definitions import defs

    _fragmented(Paths.from_env(home).ensure().lakehouse)
    schedule = defs.resolve_schedule_def("weekly_lakehouse_maintenance")
    assert (schedule.cron_schedule, schedule.execution_timezone, schedule.job_name) == ("0 3 * * 0", "UTC", "maintain_lakehouse_job")
    job = defs.get_job_def("maintain_lakehouse_job")
    with DagsterInstance.ephemeral() as instance:
        result = job.execute_in_process(instance=instance)
        assert result.success
        reports = {r["table"]: r for r in result.output_for_node("maintain_lakehouse")}
        assert reports["tasks"]["files_after"] == 2 and reports["quarantine"]["files_after"] == 1
        [output] = [e for e in result.all_events if e.is_successful_output]
        meta = output.step_output_data.metadata
        assert meta["files_before"].value == 20 and meta["files_after"].value == 3
        assert meta["tasks"].value["rows_before"] == meta["tasks"].value["rows_after"] == 36
        assert "| tasks | 12 → 2 | 36 → 36 |" in meta["summary"].value

        refused = job.execute_in_process(
            instance=instance, raise_on_error=False,
            run_config={"ops": {"maintain_lakehouse": {"config": {"vacuum_retention_hours": 1}}}},
        )
        assert not refused.success
        assert Lakehouse(Paths.from_env(home).lakehouse).stats("tasks")["files"] == 2
