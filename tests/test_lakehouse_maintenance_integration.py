"""Maintenance: compaction, vacuum and checkpoints change files, never rows; the Dagster job and the CLI."""

from datetime import datetime, timezone

from dagster import DagsterInstance

from tentalis_pipelines.lakehouse import Lakehouse
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




