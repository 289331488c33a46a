"""Sensors and schedules: new task files start rollouts; fresh trajectories and the night start training."""


import json

from dagster import (
    DefaultScheduleStatus,
    DefaultSensorStatus,
    MultiPartitionKey,
    RunRequest,
    ScheduleEvaluationContext,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    schedule,
    sensor,
)

from assets.benchmark_assets import checkpoint_ids
from assets.partitions import task_batches
from tentalis_pipelines import pipeline
from tentalis_pipelines.resources import BenchmarkResource, LakehouseResource, TrainerResource
from tentalis_pipelines.tasks.batches import register_file_batch, scan_inbox


@sensor(job_name="rollout_job", minimum_interval_seconds=30, default_status=DefaultSensorStatus.RUNNING)
def task_inbox(context: SensorEvaluationContext, lakehouse: LakehouseResource):
    """Each new ``$TENTALIS_HOME/inbox/*.jsonl`` file becomes a task batch (a dynamic partition, its
    input snapshotted) and one rollout run, exactly once: the batch id is the file name plus a hash of
    its bytes, the run key is the batch id, and the cursor remembers every batch seen."""
    paths = lakehouse.paths()
    seen = set(json.loads(context.cursor)) if context.cursor else set()
    new: list[str] = []
    for f in scan_inbox(paths.inbox):
        if f.batch_id in seen or f.batch_id in new:
            continue
        if context.instance.has_dynamic_partition(task_batches.name, f.batch_id):
            seen.add(f.batch_id)
            continue
        register_file_batch(paths.batches, f.path, f.batch_id)
        new.append(f.batch_id)
    if not new:
        return SensorResult(skip_reason=SkipReason(f"no new files in {paths.inbox}"), cursor=json.dumps(sorted(seen)))
    return SensorResult(
        run_requests=[RunRequest(run_key=b, partition_key=b, tags={"tentalis/source": "inbox"}) for b in new],
        dynamic_partitions_requests=[task_batches.build_add_request(new)],
        cursor=json.dumps(sorted(seen | set(new))),
    )


def _training_run_key(lakehouse: LakehouseResource) -> str:
    lake = lakehouse.lakehouse()
    versions = [lake.table(t).version() if lake.exists(t) else -1 for t in ("trajectories", "checkpoints")]
    return f"train-trajectories-v{versions[0]}-checkpoints-v{versions[1]}"


@sensor(job_name="train_job", minimum_interval_seconds=60, default_status=DefaultSensorStatus.RUNNING)
def fresh_trajectories(context: SensorEvaluationContext, lakehouse: LakehouseResource, trainer: TrainerResource):
    """Requests training once ``fresh_trajectory_threshold`` trajectories of the serving policy exist
    that no checkpoint has trained on."""
    n = pipeline.fresh_trajectory_count(lakehouse.lakehouse(), lakehouse.paths())
    if n < trainer.fresh_trajectory_threshold:
        return SkipReason(f"{n} fresh trajectories; training starts at {trainer.fresh_trajectory_threshold}")
    return RunRequest(run_key=_training_run_key(lakehouse), tags={"tentalis/fresh_trajectories": str(n)})


@schedule(job_name="learning_cycle_job", cron_schedule="0 2 * * *", execution_timezone="UTC",
          default_status=DefaultScheduleStatus.RUNNING)
def nightly_learning_cycle(context: ScheduleEvaluationContext):
    """Nightly at 02:00 UTC: one learning cycle (a fresh seeded batch, rollouts, reviews, training on
    every fresh trajectory of the serving policy, the promotion gate on held-out tasks)."""
    return RunRequest(run_key=f"nightly-{context.scheduled_execution_time:%Y-%m-%d}", tags={"tentalis/trigger": "nightly"})


@sensor(job_name="benchmark_job", minimum_interval_seconds=60, default_status=DefaultSensorStatus.RUNNING)
def new_checkpoints(context: SensorEvaluationContext, lakehouse: LakehouseResource, bench: BenchmarkResource):
    """Every new checkpoint (and the base model, once) gets its benchmarks: a partition per checkpoint
    and one run per (checkpoint, benchmark), the gate benchmark first. Run keys make each run once."""
    lake = lakehouse.lakehouse()
    ids = ["base"] + [r["checkpoint_id"] for r in sorted(lake.read("checkpoints").to_pylist(), key=lambda r: r["created_at"])]
    new = [c for c in ids if not context.instance.has_dynamic_partition(checkpoint_ids.name, c)]
    if not new:
        return SkipReason("no new checkpoints")
    order = [bench.gate_benchmark] + [b for b in bench.benchmarks if b != bench.gate_benchmark]
    requests = [
        RunRequest(run_key=f"{c}|{b}", partition_key=MultiPartitionKey({"checkpoint": c, "benchmark": b}))
        for c in new
        for b in order
    ]
    return SensorResult(run_requests=requests, dynamic_partitions_requests=[checkpoint_ids.build_add_request(new)])
