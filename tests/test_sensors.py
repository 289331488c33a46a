"""Sensors on a real ephemeral Dagster instance."""

import json
from datetime import datetime, timezone
from pathlib import Path

import pytest
from dagster import (
    DagsterInstance,
    DagsterRunStatus,
    RunRequest,
    SkipReason,
    build_schedule_context,
    build_sensor_context,
)
from dagster._core.test_utils import create_run_for_test

from assets.resources import BenchmarkResource, CycleResource, LakehouseResource, TrainerResource
from jobs.sensors import fresh_trajectories, gate_ready, new_checkpoints, nightly_learning_cycle, task_inbox
from tentalis_pipelines.lakehouse import Lakehouse
from tentalis_pipelines.settings import Paths


@pytest.fixture()
def instance():
    with DagsterInstance.ephemeral() as inst:
        yield inst


@pytest.fixture()
def no_settle(monkeypatch):
    monkeypatch.setenv("TENTALIS_INBOX_SETTLE_SECONDS", "0")


def _evaluate_inbox(instance, home, cursor=None, *, launch=True):
    ctx = build_sensor_context(instance=instance, cursor=cursor, resources={"lakehouse": LakehouseResource(home=str(home))})
    result = task_inbox(ctx)
    # What the daemon does with the result: add the requested partitions, then create each run
    # (launch=False: the daemon died in between, leaving a partition without a run).
    for req in result.dynamic_partitions_requests or []:
        instance.add_dynamic_partitions(req.partitions_def_name, list(req.partition_keys))
    if launch:
        for req in result.run_requests or []:
            create_run_for_test(instance, job_name="rollout_job",
                                tags={"dagster/partition": req.partition_key, "dagster/run_key": req.run_key})
    return result


def test_new_inbox_file_yields_one_run_and_one_partition_once(instance, home, no_settle):
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


def test_a_partition_whose_run_never_started_is_requested_again(instance, home, no_settle):
    paths = Paths.from_env(home).ensure()
    (paths.inbox / "late.jsonl").write_text(json.dumps({"prompt": "2 + 2?", "reference": "4"}) + "\n")
    first = _evaluate_inbox(instance, home, launch=False)  # partition added, run never created
    batch_id = first.run_requests[0].partition_key
    again = _evaluate_inbox(instance, home, cursor=first.cursor)
    assert [(r.partition_key, r.run_key) for r in again.run_requests] == [(batch_id, batch_id)]
    assert not again.dynamic_partitions_requests  # the partition is not added twice
    third = _evaluate_inbox(instance, home, cursor=again.cursor)
    assert not third.run_requests  # now that its run exists: done


def test_a_file_being_written_is_taken_once_it_settles(instance, home, monkeypatch):
    import os
    import time

    monkeypatch.setenv("TENTALIS_INBOX_SETTLE_SECONDS", "10")
    paths = Paths.from_env(home).ensure()
    f = paths.inbox / "growing.jsonl"
    f.write_text(json.dumps({"prompt": "1 + 1?", "reference": "2"}) + "\n")  # the writer is not done
    (paths.inbox / "renamed.jsonl.part").write_text(json.dumps({"prompt": "x", "reference": "1"}) + "\n")
    first = _evaluate_inbox(instance, home)
    assert not first.run_requests and not instance.get_dynamic_partitions("task_batches")
    with f.open("a") as fh:
        fh.write(json.dumps({"prompt": "2 + 2?", "reference": "4"}) + "\n")
    old = time.time() - 60
    os.utime(f, (old, old))  # unchanged for a minute: settled
    second = _evaluate_inbox(instance, home, cursor=first.cursor)
    assert len(second.run_requests) == 1  # one batch, of the complete file
    batch_id = second.run_requests[0].partition_key
    assert (paths.batches / batch_id / "tasks.jsonl").read_text().count("\n") == 2
    assert len(instance.get_dynamic_partitions("task_batches")) == 1


def test_poisoned_inbox_entries_are_refused_one_by_one(instance, home, no_settle, tmp_path):
    """Symlinks (out of the inbox, dangling), a FIFO and a folder never block a good file and are never read."""
    import os

    from table_hashes import table_hashes

    paths = Paths.from_env(home).ensure()
    secret = tmp_path / ".env"
    secret.write_text("OPENAI_API_KEY=sk-very-secret\n")
    (paths.inbox / "passwd.jsonl").symlink_to("/etc/passwd")
    (paths.inbox / "env.jsonl").symlink_to(secret)
    (paths.inbox / "dangling.jsonl").symlink_to(tmp_path / "gone")
    os.mkfifo(paths.inbox / "pipe.jsonl")
    (paths.inbox / "folder.jsonl").mkdir()
    (paths.inbox / "good.jsonl").write_text(json.dumps({"prompt": "2 + 2?", "reference": "4"}) + "\n")

    first = _evaluate_inbox(instance, home)  # must not hang on the FIFO nor fail on the symlinks
    assert [r.partition_key.startswith("good-") for r in first.run_requests] == [True]
    lake = Lakehouse(paths.lakehouse)
    q = {Path(r["source"]).name: r for r in lake.read("quarantine").to_pylist()}
    assert set(q) == {"passwd.jsonl", "env.jsonl", "dangling.jsonl", "pipe.jsonl", "folder.jsonl"}
    assert all(r["raw"] == "" and r["stage"] == "inbox" for r in q.values())
    assert "symlink" in q["env.jsonl"]["error"] and "regular file" in q["pipe.jsonl"]["error"]
    snapshots = "".join(p.read_text() for p in paths.batches.rglob("*.jsonl"))
    assert "root:" not in snapshots and "sk-very-secret" not in snapshots
    before = table_hashes(paths.lakehouse)
    again = _evaluate_inbox(instance, home, cursor=first.cursor)  # refused once, not every tick
    assert not again.run_requests and table_hashes(paths.lakehouse) == before


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


def test_fresh_trajectories_trains_after_a_nightly_batch_below_the_threshold(instance, home):
    lake = Lakehouse(Paths.from_env(home).ensure().lakehouse)
    resources = {"lakehouse": LakehouseResource(home=str(home)), "trainer": TrainerResource(fresh_trajectory_threshold=64)}
    lake.write_batch("trajectories", "nightly-20261123", [_trajectory(i, "nightly-20261123") for i in range(8)])

    def evaluate():
        return fresh_trajectories(build_sensor_context(instance=instance, resources=resources))

    assert isinstance(evaluate(), SkipReason)  # 8 < 64 and no cycle's rollouts have finished
    create_run_for_test(instance, job_name="rollout_job", status=DagsterRunStatus.SUCCESS,
                        tags={"dagster/partition": "other-batch", "tentalis/trigger": "nightly"})
    assert isinstance(evaluate(), SkipReason)  # a finished nightly run of another batch: nothing fresh from it
    create_run_for_test(instance, job_name="rollout_job", status=DagsterRunStatus.FAILURE,
                        tags={"dagster/partition": "nightly-20261123", "tentalis/trigger": "nightly"})
    assert isinstance(evaluate(), SkipReason)  # its rollouts failed
    create_run_for_test(instance, job_name="rollout_job", status=DagsterRunStatus.SUCCESS,
                        tags={"dagster/partition": "nightly-20261123", "tentalis/trigger": "nightly"})
    fired = evaluate()
    assert isinstance(fired, RunRequest) and fired.tags["tentalis/reason"] == "nightly cycle batch nightly-20261123"


def _night(instance, home, day: int):
    from assets.partitions import task_batches
    from tentalis_pipelines.definitions import defs

    ctx = build_schedule_context(instance=instance, scheduled_execution_time=datetime(2026, 11, day, 2, 0, tzinfo=timezone.utc),
                                 resources={"lakehouse": LakehouseResource(home=str(home)), "cycle": CycleResource(num_tasks=5, levels=[1])},
                                 repository_def=defs.get_repository_def())
    return nightly_learning_cycle(ctx), task_batches


@pytest.fixture()
def stored_instance():
    """A persistent temporary instance: schedules need an instance reference (an ephemeral one has none)."""
    from dagster import instance_for_test

    with instance_for_test() as inst:
        yield inst


def test_nightly_schedule_registers_the_nights_batch_and_requests_its_rollouts(stored_instance, home):
    instance = stored_instance
    req, task_batches = _night(instance, home, 23)
    assert isinstance(req, RunRequest) and req.run_key == "nightly-20261123" and req.partition_key == "nightly-20261123"
    assert req.tags["tentalis/trigger"] == "nightly"
    assert instance.get_dynamic_partitions(task_batches.name) == ["nightly-20261123"]
    manifest = json.loads((Paths.from_env(home).batches / "nightly-20261123" / "manifest.json").read_text())
    assert manifest == {"kind": "arithmetic", "family": "arithmetic", "seed": 1, "num_tasks": 5, "levels": [1],
                        "recipe": {"temperature": None, "max_new_tokens": None, "max_turns": None, "num_generations": None}}
    again, _ = _night(instance, home, 23)  # the same night evaluated again: the same batch, no second one
    assert again.partition_key == "nightly-20261123" and instance.get_dynamic_partitions(task_batches.name) == ["nightly-20261123"]
    nxt, _ = _night(instance, home, 24)  # the next night: a fresh seed
    assert json.loads((Paths.from_env(home).batches / nxt.partition_key / "manifest.json").read_text())["seed"] == 2
    assert nightly_learning_cycle.cron_schedule == "0 2 * * *" and nightly_learning_cycle.execution_timezone == "UTC"
    assert nightly_learning_cycle.job_name == "rollout_job"


def _items(cid: str, n_correct: int, skill_ids: tuple[str, ...] = ()) -> list[dict]:
    return [{"checkpoint_id": cid, "benchmark": "arithmetic", "item_id": f"i{k}", "prompt": "p", "completion": "c",
             "extracted_answer": "1", "reference": "1", "correct": k < n_correct, "lenient_correct": k < n_correct,
             "formatted": True, "created_at": datetime.now(timezone.utc), "skill_ids": list(skill_ids)} for k in range(20)]


def _checkpoint(lake, cid: str) -> None:
    lake.append("checkpoints", [{"checkpoint_id": cid, "parent_id": None, "base_model": "m", "adapter_uri": "/x", "algorithm": "grpo",
                                 "config": "{}", "trained_on": [], "trajectory_ids": [], "trajectory_count": 0, "metrics": "{}",
                                 "promoted": False, "created_at": datetime.now(timezone.utc)}])


def test_new_checkpoints_requests_every_missing_benchmark_whoever_wrote_the_others(instance, home):
    from dagster import MultiPartitionKey

    lake = Lakehouse(Paths.from_env(home).ensure().lakehouse)
    resources = {"lakehouse": LakehouseResource(home=str(home)), "benchmark": BenchmarkResource(benchmarks=["arithmetic", "gsm8k"])}
    _checkpoint(lake, "ck1")
    # The CLI already benchmarked base on arithmetic and registered ck1's partition: neither hides what is missing.
    lake.replace_where("benchmark_results", {"checkpoint_id": "base", "benchmark": "arithmetic"},
                       [{"checkpoint_id": "base", "benchmark": "arithmetic", "n": 20, "accuracy": 0.5, "created_at": datetime.now(timezone.utc)}])
    instance.add_dynamic_partitions("checkpoint_ids", ["ck1"])
    result = new_checkpoints(build_sensor_context(instance=instance, resources=resources))
    keys = [(r.partition_key.keys_by_dimension["checkpoint"], r.partition_key.keys_by_dimension["benchmark"]) for r in result.run_requests]
    assert keys == [("base", "gsm8k"), ("ck1", "arithmetic"), ("ck1", "gsm8k")]
    assert all(isinstance(r.partition_key, MultiPartitionKey) for r in result.run_requests)
    assert [list(req.partition_keys) for req in result.dynamic_partitions_requests] == [["base"]]


def test_gate_ready_waits_for_both_results_then_requests_the_gate_once(instance, home):
    from tentalis_pipelines import promotion

    lake = Lakehouse(Paths.from_env(home).ensure().lakehouse)
    resources = {"lakehouse": LakehouseResource(home=str(home)), "benchmark": BenchmarkResource(), "trainer": TrainerResource()}

    def evaluate():
        return gate_ready(build_sensor_context(instance=instance, resources=resources))

    assert "no checkpoint awaits" in evaluate().skip_message
    _checkpoint(lake, "ck1")
    lake.replace_where("benchmark_items", {"checkpoint_id": "ck1", "benchmark": "arithmetic"}, _items("ck1", 2))
    assert evaluate().skip_message == "ck1 waits for arithmetic results of base"
    lake.replace_where("benchmark_items", {"checkpoint_id": "base", "benchmark": "arithmetic"}, _items("base", 18))
    req = evaluate()
    assert isinstance(req, RunRequest) and req.run_key == "gate|ck1"
    assert req.run_config == {"ops": {"serving": {"config": {"checkpoint_id": "ck1"}}}}
    _, decision = promotion.decide_promotion(lake, "ck1", "arithmetic")  # what the requested run does: 2/20 vs 18/20
    assert not decision.promote
    assert "no checkpoint awaits" in evaluate().skip_message  # decided (rejected) once: never gated again


def test_an_incumbent_measured_with_other_skills_is_measured_again_before_the_gate(instance, home):
    lake = Lakehouse(Paths.from_env(home).ensure().lakehouse)
    resources = {"lakehouse": LakehouseResource(home=str(home)), "benchmark": BenchmarkResource(benchmarks=["arithmetic"]),
                 "trainer": TrainerResource()}
    _checkpoint(lake, "ck1")
    instance.add_dynamic_partitions("checkpoint_ids", ["base", "ck1"])

    def measured(cid: str, n_correct: int, skill_ids: tuple[str, ...] = ()) -> None:
        key = {"checkpoint_id": cid, "benchmark": "arithmetic"}
        lake.replace_where("benchmark_items", key, _items(cid, n_correct, skill_ids))
        lake.replace_where("benchmark_results", key, [{**key, "n": 20, "accuracy": n_correct / 20, "created_at": datetime.now(timezone.utc)}])

    measured("base", 18, ("sk-1",))  # while sk-1 was verified
    measured("ck1", 2)  # after it was retired
    result = new_checkpoints(build_sensor_context(instance=instance, resources=resources))
    assert [(r.run_key, r.partition_key.keys_by_dimension["checkpoint"]) for r in result.run_requests] == [("base|arithmetic|skills-of-ck1", "base")]
    assert gate_ready(build_sensor_context(instance=instance, resources=resources)).skip_message == "ck1 waits for arithmetic results of base"
    measured("base", 2)  # the requested run: base again, with ck1's (empty) skill set
    assert isinstance(new_checkpoints(build_sensor_context(instance=instance, resources=resources)), SkipReason)
    assert gate_ready(build_sensor_context(instance=instance, resources=resources)).run_key == "gate|ck1"
