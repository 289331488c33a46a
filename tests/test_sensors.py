"""Sensors on a real ephemeral Dagster instance."""

import json
from datetime import datetime, timezone

import pytest
from dagster import DagsterInstance, RunRequest, SkipReason, build_schedule_context, build_sensor_context

from jobs.sensors import fresh_trajectories, nightly_learning_cycle, task_inbox
from tentalis_pipelines.lakehouse import Lakehouse
from tentalis_pipelines.resources import LakehouseResource, TrainerResource
from tentalis_pipelines.settings import Paths


@pytest.fixture()
def instance():
    with DagsterInstance.ephemeral() as inst:
        yield inst


def _evaluate_inbox(instance, home, cursor=None):
    ctx = build_sensor_context(instance=instance, cursor=cursor, resources={"lakehouse": LakehouseResource(home=str(home))})
    result = task_inbox(ctx)
    # What the daemon does with the result: add the requested partitions.
    for req in result.dynamic_partitions_requests or []:
        instance.add_dynamic_partitions(req.partitions_def_name, list(req.partition_keys))
    return result


def test_new_inbox_file_yields_one_run_and_one_partition_once(instance, home):
    paths = Paths.from_env(home).ensure()
    (paths.inbox / "team-a.jsonl").write_text(json.dumps({"prompt": "2 + 2?", "reference": "4"}) + "\n")

    first = _evaluate_inbox(instance, home)
    assert len(first.run_requests) == 1
    batch_id = first.run_requests[0].partition_key
    assert first.run_requests[0].run_key == batch_id
    assert instance.get_dynamic_partitions("task_batches") == [batch_id]
    assert (paths.batches / batch_id / "tasks.jsonl").exists()  # snapshot taken

    again = _evaluate_inbox(instance, home, cursor=first.cursor)
    assert not again.run_requests
    # Even with the cursor lost, an existing partition is never requested twice.
    lost_cursor = _evaluate_inbox(instance, home, cursor=None)
    assert not lost_cursor.run_requests
    assert instance.get_dynamic_partitions("task_batches") == [batch_id]

    (paths.inbox / "team-b.jsonl").write_text(json.dumps({"prompt": "3 + 3?", "reference": "6"}) + "\n")
    third = _evaluate_inbox(instance, home, cursor=again.cursor)
    assert [r.partition_key for r in third.run_requests] != [batch_id]
    assert len(third.run_requests) == 1
    assert len(instance.get_dynamic_partitions("task_batches")) == 2


def _trajectory(i: int, batch: str = "b1") -> dict:
    return {
        "batch_id": batch, "rollout_id": f"r{i}", "task_id": f"t{i // 4}", "group_index": i % 4,
        "policy_version": "base", "outcome_reward": float(i % 2), "format_reward": 1.0, "process_reward": None,
        "step_rewards": [], "manager_score": 1.0, "reward": float(i % 2), "reward_weights": "{}",
        "advantage": 1.0 if i % 2 else -1.0, "step_advantages": [], "advantage_mode": "outcome", "kept": True, "created_at": datetime.now(timezone.utc),
    }


def test_fresh_trajectories_fires_at_threshold_and_not_before(instance, home):
    lake = Lakehouse(Paths.from_env(home).ensure().lakehouse)
    resources = {"lakehouse": LakehouseResource(home=str(home)), "trainer": TrainerResource(fresh_trajectory_threshold=8)}

    def evaluate():
        return fresh_trajectories(build_sensor_context(instance=instance, resources=resources))

    assert isinstance(evaluate(), SkipReason)  # no table yet
    lake.write_batch("trajectories", "b1", [_trajectory(i) for i in range(7)])
    before = evaluate()
    assert isinstance(before, SkipReason) and "7 fresh" in before.skip_message
    lake.write_batch("trajectories", "b1", [_trajectory(i) for i in range(8)])
    fired = evaluate()
    assert isinstance(fired, RunRequest)
    assert fired.tags["tentalis/fresh_trajectories"] == "8"


def test_nightly_schedule_runs_one_learning_cycle_at_two_utc(instance):
    from datetime import datetime, timezone

    ctx = build_schedule_context(instance=instance, scheduled_execution_time=datetime(2026, 11, 23, 2, 0, tzinfo=timezone.utc))
    req = nightly_learning_cycle(ctx)
    assert isinstance(req, RunRequest) and req.run_key == "nightly-2026-11-23"
    assert nightly_learning_cycle.cron_schedule == "0 2 * * *"
    assert nightly_learning_cycle.execution_timezone == "UTC"
    assert nightly_learning_cycle.job_name == "learning_cycle_job"
