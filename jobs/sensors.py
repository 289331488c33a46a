"""Sensors and schedules: the automation that chains the asset jobs into learning cycles.

New inbox files, reviewed live sessions and the nightly schedule start ``rollout_job``; fresh trajectories (or a finished
nightly batch) start ``train_job``; checkpoints without results start ``benchmark_job``; complete gate
results start ``promotion_job``. Everything that loads a model is off until automation is turned on.
"""


import json
import os
from datetime import datetime, timezone

from dagster import (
    DagsterRunStatus,
    DefaultScheduleStatus,
    DefaultSensorStatus,
    MultiPartitionKey,
    RunRequest,
    RunsFilter,
    ScheduleEvaluationContext,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    schedule,
    sensor,
)

from assets.partitions import checkpoint_ids, task_batches
from assets.resources import (
    BenchmarkResource,
    CycleResource,
    LakehouseResource,
    ReviewResource,
    TrainerResource,
)
from tentalis_pipelines import promotion, sessions
from tentalis_pipelines.activity import activity_path, idle_seconds, last_activity_ns
from tentalis_pipelines.settings import (
    inbox_settle_seconds,
    session_review_wait_seconds,
    session_settle_seconds,
)
from tentalis_pipelines.stages.idle_window import in_hours, progress_path
from tentalis_pipelines.stages.rollouts import current_policy
from tentalis_pipelines.stages.training import trainable_trajectories, untrained_trajectories
from tentalis_pipelines.tasks.batches import (
    RefusedEntry,
    register_file_batch,
    register_nightly_batch,
    scan_inbox,
)


def automation_on() -> bool:
    """``$TENTALIS_AUTOMATION`` (``on`` | ``off``, default off): whether the sensors and the schedule
    that launch model work start RUNNING. Off, nothing loads a model until a user turns automation on
    (this switch, or each sensor's toggle in the UI), so the first `tentalis ui` launches nothing."""
    value = os.environ.get("TENTALIS_AUTOMATION", "off").strip().lower()
    if value not in ("on", "off", "1", "0", "true", "false"):
        raise ValueError(f"TENTALIS_AUTOMATION={value!r}: use on or off")
    return value in ("on", "1", "true")


def automation_sensor_status() -> DefaultSensorStatus:
    return DefaultSensorStatus.RUNNING if automation_on() else DefaultSensorStatus.STOPPED


def automation_schedule_status() -> DefaultScheduleStatus:
    return DefaultScheduleStatus.RUNNING if automation_on() else DefaultScheduleStatus.STOPPED


@sensor(job_name="rollout_job", minimum_interval_seconds=30, default_status=automation_sensor_status())
def task_inbox(context: SensorEvaluationContext, lakehouse: LakehouseResource):
    """Each new, settled ``$TENTALIS_HOME/inbox/*.jsonl`` file becomes a task batch (a dynamic partition,
    its input snapshotted) and one rollout run, exactly once: the batch id is the file name plus a hash
    of its bytes, the run key is the batch id, and the cursor remembers every batch seen.

    A file is taken once it has been unchanged for ``$TENTALIS_INBOX_SETTLE_SECONDS`` (default 10);
    writers that write ``name.jsonl.part`` and rename it are never taken half-way. Symlinks, special
    files and unreadable entries are refused one by one (recorded once in ``quarantine``, their content
    never read) and never block the other files. A batch whose partition exists but whose run never
    started (the daemon died, the disk filled) is requested again under the same run key.
    """
    paths = lakehouse.paths()
    cursor = json.loads(context.cursor) if context.cursor else {}
    if isinstance(cursor, list):  # the cursor of earlier versions: the seen batch ids
        cursor = {"seen": cursor}
    seen, reported = set(cursor.get("seen", [])), set(cursor.get("refused", []))
    refused: list[RefusedEntry] = []
    new: list[str] = []
    stranded: list[str] = []
    for f in scan_inbox(paths.inbox, settle_seconds=inbox_settle_seconds(), refused=refused):
        if f.batch_id in seen or f.batch_id in new or f.batch_id in stranded:
            continue
        if context.instance.has_dynamic_partition(task_batches.name, f.batch_id):
            if _has_run(context, f.batch_id):
                seen.add(f.batch_id)
            else:
                stranded.append(f.batch_id)
            continue
        try:
            register_file_batch(paths.batches, f.path, f.batch_id)
        except (OSError, ValueError) as exc:  # changed or vanished since the scan: a later tick
            context.log.warning(f"inbox file {f.path.name} skipped this tick: {exc}")
            continue
        new.append(f.batch_id)
    fresh_refusals = [r for r in refused if f"{r.path.name}|{r.reason}" not in reported]
    if fresh_refusals:
        lakehouse.lakehouse().quarantine(
            [{"source": str(r.path), "line": None, "raw": "", "error": f"inbox entry refused: {r.reason}", "stage": "inbox"}
             for r in fresh_refusals]
        )
        for r in fresh_refusals:
            context.log.warning(f"inbox entry {r.path.name} refused: {r.reason}")
    reported |= {f"{r.path.name}|{r.reason}" for r in refused}
    # "seen" holds only batches whose run exists; the ones requested now are confirmed on a later tick
    # (by then the daemon has created their runs; a request with a used run key is dropped by Dagster).
    next_cursor = json.dumps({"seen": sorted(seen), "refused": sorted(reported)})
    if not new and not stranded:
        return SensorResult(skip_reason=SkipReason(f"no new files in {paths.inbox}"), cursor=next_cursor)
    return SensorResult(
        run_requests=[RunRequest(run_key=b, partition_key=b, tags={"tentalis/source": "inbox"}) for b in new + stranded],
        dynamic_partitions_requests=[task_batches.build_add_request(new)] if new else [],
        cursor=next_cursor,
    )


@sensor(job_name="rollout_job", minimum_interval_seconds=60, default_status=automation_sensor_status())
def fresh_sessions(context: SensorEvaluationContext, lakehouse: LakehouseResource, review: ReviewResource):
    """Reviewed live sessions (``reviews`` of batch ``live``) that no batch holds yet and that have had
    no new turn for ``$TENTALIS_SESSION_SETTLE_SECONDS`` (default 60) become one task batch
    ``sessions-<hash of their ids>`` (its session ids snapshotted under ``$TENTALIS_HOME/batches``) and
    one rollout run, in one ``SensorResult``, exactly once: the run key is the batch id and a cut
    session is never cut again. A cut whose partition or run never came about (the daemon died) is
    requested again under the same run key. The batch's assets build multi-turn trajectories from the
    turns (``tentalis_pipelines/sessions.py``). A cut records each session's turns; a session that gets
    new turns after its cut is cut again, as a *continuation* holding only the new turns, once they are
    reviewed (a review of one of them, or of the session made after them) or the judge's wait is over.

    With a judge configured (``review.manager = llm``), a session that nobody reviewed is cut too once it
    has had no new turn for ``$TENTALIS_SESSION_REVIEW_WAIT_SECONDS`` (default 3600): the batch's
    ``reviews`` stage has the judge review it. Without a judge such sessions wait, uncut, for a person's
    review (a cut session is never cut again, so cutting one that nothing can score would lose it)."""
    lake, paths = lakehouse.lakehouse(), lakehouse.paths()
    cursor = json.loads(context.cursor) if context.cursor else {}
    seen = set(cursor.get("seen", []))
    new: list[str] = []
    stranded: list[str] = []
    for batch_id in sessions.cut_sessions(paths.batches):
        if batch_id in seen:
            continue
        if not context.instance.has_dynamic_partition(task_batches.name, batch_id):
            new.append(batch_id)  # snapshotted, but the partition was never added
        elif _has_run(context, batch_id):
            seen.add(batch_id)
        else:
            stranded.append(batch_id)
    wait = session_review_wait_seconds() if review.manager == "llm" else None
    plan = sessions.plan_cut(lake, paths.batches, settle_seconds=session_settle_seconds(), review_wait_seconds=wait)
    if plan:
        new.append(sessions.register_sessions_batch(paths.batches, list(plan), plan))
        continued = sum(1 for first, _ in plan.values() if first > 0)
        context.log.info(f"cut {len(plan)} session(s) into {new[-1]} ({continued} continuation(s) of sessions cut before)")
    next_cursor = json.dumps({"seen": sorted(seen)})
    if not new and not stranded:
        waiting = ("no reviewed session waits for a batch" if wait is None else
                   f"no reviewed session, and no session unreviewed for {wait:g} s, waits for a batch")
        return SensorResult(skip_reason=SkipReason(waiting), cursor=next_cursor)
    return SensorResult(
        run_requests=[RunRequest(run_key=b, partition_key=b, tags={"tentalis/source": "sessions"}) for b in new + stranded],
        dynamic_partitions_requests=[task_batches.build_add_request(new)] if new else [],
        cursor=next_cursor,
    )


def _has_run(context: SensorEvaluationContext, batch_id: str) -> bool:
    """Whether any run (of any job) was ever created for this task batch partition."""
    runs = context.instance.get_run_records(filters=RunsFilter(tags={"dagster/partition": batch_id}), limit=1)
    return bool(runs)


def _training_run_key(lakehouse: LakehouseResource) -> str:
    lake = lakehouse.lakehouse()
    versions = [lake.table(t).version() if lake.exists(t) else -1 for t in ("trajectories", "checkpoints")]
    return f"train-trajectories-v{versions[0]}-checkpoints-v{versions[1]}"


def _finished_cycle_batches(context: SensorEvaluationContext) -> set[str]:
    """Task batches whose nightly-cycle rollout run succeeded (the cycle trains on them next)."""
    records = context.instance.get_run_records(
        filters=RunsFilter(job_name="rollout_job", statuses=[DagsterRunStatus.SUCCESS], tags={"tentalis/trigger": "nightly"}), limit=20)
    return {r.dagster_run.tags.get("dagster/partition") for r in records} - {None}


@sensor(job_name="train_job", minimum_interval_seconds=60, default_status=automation_sensor_status())
def fresh_trajectories(context: SensorEvaluationContext, lakehouse: LakehouseResource, trainer: TrainerResource):
    """Requests training when ``fresh_trajectory_threshold`` trajectories of the serving policy exist that
    no checkpoint has trained on, or when a nightly cycle's rollouts have finished and their trajectories
    are fresh. The run key is the data's state (table versions), so one state trains once."""
    lake, paths = lakehouse.lakehouse(), lakehouse.paths()
    version, _ = current_policy(lake, paths)
    fresh = untrained_trajectories(lake, version)
    n = fresh.num_rows
    cycle = sorted(set(fresh.column("batch_id").to_pylist()) & _finished_cycle_batches(context)) if n else []
    if n < trainer.fresh_trajectory_threshold and not cycle:
        return SkipReason(f"{n} fresh trajectories; training starts at {trainer.fresh_trajectory_threshold} "
                          "or after a nightly cycle's rollouts")
    why = f"nightly cycle batch {cycle[0]}" if cycle else f"{n} fresh trajectories"
    return RunRequest(run_key=_training_run_key(lakehouse), tags={"tentalis/fresh_trajectories": str(n), "tentalis/reason": why})


_IN_FLIGHT = [DagsterRunStatus.QUEUED, DagsterRunStatus.NOT_STARTED, DagsterRunStatus.STARTING, DagsterRunStatus.STARTED]


@sensor(job_name="idle_train_job", minimum_interval_seconds=30, default_status=automation_sensor_status())
def idle_window(context: SensorEvaluationContext, lakehouse: LakehouseResource, trainer: TrainerResource):
    """Opens an idle training window when the gateway (``tentalis serve`` on this box) has served no
    model request for ``trainer.idle_minutes``, inside ``trainer.idle_hours`` (UTC, e.g. ``22:00-06:00``;
    empty: any time), no training run is queued or running, and there is work: a window's saved
    progress to resume, or ``trainer.fresh_trajectory_threshold`` fresh trajectories. The run is told
    the activity stamp seen here and yields as soon as it changes; the run key holds that stamp and the
    tables' versions, so one quiet spell opens one window per state of the data."""
    paths = lakehouse.paths()
    marker = activity_path(paths.home)
    stamp, idle = last_activity_ns(marker), idle_seconds(marker)
    if idle is not None and idle < trainer.idle_minutes * 60:
        return SkipReason(f"the gateway served {idle:.0f} s ago; a window opens after {trainer.idle_minutes:g} idle minutes")
    now = datetime.now(timezone.utc)
    if not in_hours(now, trainer.idle_hours):
        return SkipReason(f"{now:%H:%M} UTC is outside trainer.idle_hours = {trainer.idle_hours}")
    busy = context.instance.get_run_records(filters=RunsFilter(job_name="idle_train_job", statuses=_IN_FLIGHT), limit=1) or \
        context.instance.get_run_records(filters=RunsFilter(job_name="train_job", statuses=_IN_FLIGHT), limit=1)
    if busy:
        return SkipReason(f"training run {busy[0].dagster_run.run_id} of {busy[0].dagster_run.job_name} is in flight")
    lake = lakehouse.lakehouse()
    resume = progress_path(paths).exists()
    if not resume:
        version, _ = current_policy(lake, paths)
        n = len(trainable_trajectories(lake, version, trainer.max_policy_lag)[0])
        if n < trainer.fresh_trajectory_threshold:
            return SkipReason(f"{n} fresh trajectories and no saved window progress; a window trains from "
                              f"{trainer.fresh_trajectory_threshold} (trainer.fresh_trajectory_threshold)")
    quiet = "never served" if idle is None else f"idle {idle / 60:.1f} min"
    return RunRequest(run_key=f"idle-{stamp or 0}-{_training_run_key(lakehouse)}",
                      run_config={"ops": {"training_windows": {"config": {"idle_since_ns": stamp}}}},
                      tags={"tentalis/trigger": "idle", "tentalis/reason": f"gateway {quiet}; {'resume' if resume else 'fresh start'}"})


@schedule(job_name="rollout_job", cron_schedule="0 2 * * *", execution_timezone="UTC",
          default_status=automation_schedule_status())
def nightly_learning_cycle(context: ScheduleEvaluationContext, lakehouse: LakehouseResource, cycle: CycleResource):
    """Nightly at 02:00 UTC, one learning cycle: a fresh seeded arithmetic batch (registered as a
    ``task_batches`` partition) and its ``rollout_job`` run. The chain goes on by itself:
    ``fresh_trajectories`` trains on the batch, ``new_checkpoints`` benchmarks the checkpoint and
    ``gate_ready`` runs the promotion gate. A re-evaluated tick reuses the night's batch."""
    day = f"{context.scheduled_execution_time:%Y%m%d}"
    batch_id = register_nightly_batch(lakehouse.paths().batches, day, num_tasks=cycle.num_tasks, levels=tuple(cycle.levels))
    # Schedules cannot return partition requests (sensors can); the snapshot above exists first, so the
    # partition never points at a missing input.
    if not context.instance.has_dynamic_partition(task_batches.name, batch_id):
        context.instance.add_dynamic_partitions(task_batches.name, [batch_id])
    return RunRequest(run_key=f"nightly-{day}", partition_key=batch_id,
                      tags={"tentalis/trigger": "nightly", "tentalis/cycle": f"nightly-{day}"})


@sensor(job_name="benchmark_job", minimum_interval_seconds=60, default_status=automation_sensor_status())
def new_checkpoints(context: SensorEvaluationContext, lakehouse: LakehouseResource, benchmark: BenchmarkResource):
    """Every checkpoint (and the base model) gets a run of every configured benchmark it has no result
    for, the gate benchmark first: one ``benchmark_results`` partition (checkpoint x benchmark) each.
    Results written by any path (the CLI, CI, a run from the UI) count, and run keys make each request once.
    An incumbent measured with other injected skills than the newest undecided candidate is measured again."""
    lake = lakehouse.lakehouse()
    ids = ["base"]
    if lake.exists("checkpoints"):
        ids += [r["checkpoint_id"] for r in sorted(lake.read("checkpoints").to_pylist(), key=lambda r: r["created_at"])]
    done = set()
    if lake.exists("benchmark_results"):
        done = {(r["checkpoint_id"], r["benchmark"]) for r in lake.read("benchmark_results", columns=["checkpoint_id", "benchmark"]).to_pylist()}
    order = list(dict.fromkeys([benchmark.gate_benchmark, *benchmark.benchmarks]))
    todo = [(c, b, f"{c}|{b}") for c in ids for b in order if (c, b) not in done]
    # The gate compares like with like: an incumbent measured with other injected skills than the newest
    # undecided candidate is measured again, once per candidate (its own run key).
    pending = promotion.undecided_checkpoints(lake, benchmark.gate_benchmark)
    if pending:
        gate, candidate = benchmark.gate_benchmark, pending[-1]
        incumbent = promotion.incumbent_for(lake, candidate)
        if (candidate, gate) in done and (incumbent, gate) in done and promotion.skill_mismatches(lake, candidate, incumbent, gate):
            todo.append((incumbent, gate, f"{incumbent}|{gate}|skills-of-{candidate}"))
    if not todo:
        return SkipReason("every checkpoint has every configured benchmark")
    new = sorted({c for c, _, _ in todo if not context.instance.has_dynamic_partition(checkpoint_ids.name, c)})
    requests = [RunRequest(run_key=key, partition_key=MultiPartitionKey({"checkpoint": c, "benchmark": b})) for c, b, key in todo]
    return SensorResult(run_requests=requests, dynamic_partitions_requests=[checkpoint_ids.build_add_request(new)] if new else [])


@sensor(job_name="promotion_job", minimum_interval_seconds=60, default_status=automation_sensor_status())
def gate_ready(context: SensorEvaluationContext, lakehouse: LakehouseResource, benchmark: BenchmarkResource, trainer: TrainerResource):
    """Runs the promotion gate for the newest checkpoint without a decision, once the gate benchmark's
    results of it and of its incumbent are in (``trainer.promotion = gate``)."""
    if trainer.promotion != "gate":
        return SkipReason(f"trainer.promotion = {trainer.promotion}: no gate")
    lake = lakehouse.lakehouse()
    pending = promotion.undecided_checkpoints(lake, benchmark.gate_benchmark)
    if not pending:
        return SkipReason("no checkpoint awaits a gate decision")
    candidate = pending[-1]
    missing = promotion.missing_results(lake, candidate, benchmark.gate_benchmark)
    if missing:
        return SkipReason(f"{candidate} waits for {benchmark.gate_benchmark} results of {', '.join(missing)}")
    return RunRequest(run_key=f"gate|{candidate}", run_config={"ops": {"serving": {"config": {"checkpoint_id": candidate}}}},
                      tags={"tentalis/candidate": candidate})
