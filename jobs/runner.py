"""Runs of the asset jobs launched from Python (`tentalis run`, `learn`, the experiments): one job, or one
learning cycle as the jobs one after another on a Dagster instance.

``tentalis run`` and ``tentalis learn`` call :func:`run_cycle`: a seeded task batch is registered as a
``task_batches`` partition, then ``rollout_job`` (that partition), with ``skills`` ``skills_job`` (the
same partition), ``train_job``, ``benchmark_job`` for
every configured benchmark of the new checkpoint (and the incumbent's gate benchmark when it has none
yet, or had it measured with other injected skills than the candidate), and ``promotion_job`` (the gate and the learning curve). Each is a run of its own job, tagged
``tentalis/trigger`` and ``tentalis/cycle``, exactly what the sensors request when automation is on and
what CI's ``dagster job execute`` lines run (README, "In CI"). Nothing here re-implements a stage.
"""

from __future__ import annotations

import contextlib
import functools
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dagster import AssetKey, DagsterInstance, Definitions, MultiPartitionKey

from assets.partitions import checkpoint_ids, task_batches
from tentalis_pipelines import promotion
from tentalis_pipelines.lakehouse import Lakehouse
from tentalis_pipelines.settings import Paths, data_dir
from tentalis_pipelines.stages.training import fresh_trajectory_count
from tentalis_pipelines.tasks.batches import (
    family_recipe,
    interrupted_cycle_batch,
    is_task_file_source,
    next_bfcl_seed,
    next_family_seed,
    next_generator_seed,
    next_swe_seed,
    next_terminal_seed,
    register_bfcl_batch,
    register_dataset_batch,
    register_family_batch,
    register_generated_batch,
    register_swe_batch,
    register_terminal_batch,
    register_terminal_file_batch,
)
from tentalis_pipelines.tasks.families import installed_environment_families


class CycleFailed(RuntimeError):
    """A job of the cycle failed; the message names the job and each failed step's own error."""


@dataclass
class CycleOptions:
    """What one cycle generates and how its jobs are configured.

    ``resources`` is run config for the resources (``{"policy": {"config": {...}}, ...}``): only the
    fields it sets change; the rest keep the definitions' values (and the environment's, such as
    ``$TENTALIS_MODEL``)."""

    num_tasks: int = 16
    seed: int | None = None
    levels: tuple[int, ...] = (1, 2)
    train: bool = True
    resources: dict[str, Any] = field(default_factory=dict)
    trigger: str = "cli"
    # "arithmetic" (the seeded generator), "terminal" (agent episodes on the terminal generator's training
    # split, tasks/batches.register_terminal_batch), "swe" (bug-fixing episodes on the mini-SWE catalogue's
    # training split, tasks/batches.register_swe_batch) or a dataset's training split ("gsm8k": consecutive
    # slices of $TENTALIS_DATA_DIR/gsm8k/train.jsonl in a fixed order).
    task_source: str = "arithmetic"
    max_turns: int | None = None  # agent families: the episodes' turn limit (None: the family's recipe)
    # Overrides of the family's recipe written into the batch's manifest (temperature, max_new_tokens,
    # num_generations; None or absent: the family's). The rollout stage samples with the manifest's recipe.
    recipe: dict[str, Any] = field(default_factory=dict)
    # terminal: draw each batch's levels by the policy's recent success per level (tasks/curriculum.py),
    # from ``levels`` (every terminal level when empty); the choice is recorded in the batch's manifest.
    curriculum: bool = False
    # terminal: task kinds held out of every training batch (their sets, terminal-l<N>-<kind>, measure transfer)
    exclude_families: tuple[str, ...] = ()
    skills: bool = False  # run skills_job on the batch after its rollouts (distil, verify, re-check)
    skills_config: dict[str, Any] = field(default_factory=dict)  # the skills asset's config (SkillsConfig fields)


@dataclass
class JobRun:
    job: str
    run_id: str
    partition: str | None
    seconds: float


def register_batch(instance: DagsterInstance, paths: Paths, *, num_tasks: int, seed: int | None,
                   levels: tuple[int, ...], task_source: str = "arithmetic", max_turns: int | None = None,
                   recipe: dict[str, Any] | None = None, curriculum: dict[str, Any] | None = None,
                   exclude_families: tuple[str, ...] = ()) -> str:
    """Snapshot a seeded arithmetic (or, with ``task_source='terminal'``, terminal) batch, then add its
    ``task_batches`` partition (in that order, so a partition never exists without its input). Returns
    the batch id. The manifest records the family's recipe for ``levels`` with ``max_turns`` and the
    ``recipe`` overrides that are set (``tasks/families``); terminal batches leave out the task kinds in
    ``exclude_families``."""
    if exclude_families and task_source != "terminal":
        raise ValueError(f"--hold-out-kind: holds terminal task kinds out of training; --tasks {task_source!r} has none")
    if is_task_file_source(task_source):  # a bring-your-own terminal task file: its next slice
        batch_id = register_terminal_file_batch(paths.batches, Path(task_source), num_tasks=num_tasks, max_turns=max_turns,
                                                overrides=recipe)
        _ensure_batch_partition(instance, batch_id)
        return batch_id
    installed = installed_environment_families()
    if task_source in installed:  # an environment family of an installed package: the registry's generic batch
        chosen = family_recipe(task_source, tuple(levels), max_turns=max_turns, **(recipe or {}))
        seed = seed if seed is not None else next_family_seed(paths.batches, task_source)
        batch_id = register_family_batch(paths.batches, task_source, seed=seed, num_tasks=num_tasks, levels=tuple(levels), recipe=chosen)
        _ensure_batch_partition(instance, batch_id)
        return batch_id
    if task_source not in ("arithmetic", "terminal", "bfcl", "swe"):
        raise ValueError(f"task source {task_source!r}: a seeded batch is {', '.join(['arithmetic', 'terminal', 'bfcl', 'swe', *installed])}, "
                         "or a terminal task file (.jsonl)")
    chosen = family_recipe(task_source, tuple(levels), max_turns=max_turns, **(recipe or {}))
    if task_source == "terminal":
        seed = seed if seed is not None else next_terminal_seed(paths.batches)
        batch_id = register_terminal_batch(paths.batches, seed=seed, num_tasks=num_tasks, levels=tuple(levels), recipe=chosen,
                                           curriculum=curriculum, exclude_families=tuple(exclude_families))
        _ensure_batch_partition(instance, batch_id)
        return batch_id
    if task_source == "bfcl":  # generated tool-calling tasks on BFCL's simulators; max_turns: steps per user turn
        seed = seed if seed is not None else next_bfcl_seed(paths.batches)
        batch_id = register_bfcl_batch(paths.batches, seed=seed, num_tasks=num_tasks, levels=tuple(levels), recipe=chosen)
        _ensure_batch_partition(instance, batch_id)
        return batch_id
    if task_source == "swe":
        seed = seed if seed is not None else next_swe_seed(paths.batches)
        batch_id = register_swe_batch(paths.batches, seed=seed, num_tasks=num_tasks, levels=tuple(levels), recipe=chosen)
        _ensure_batch_partition(instance, batch_id)
        return batch_id
    seed = seed if seed is not None else next_generator_seed(paths.batches)
    batch_id = register_generated_batch(paths.batches, seed=seed, num_tasks=num_tasks, levels=tuple(levels), recipe=chosen)
    _ensure_batch_partition(instance, batch_id)
    return batch_id


def register_curriculum_batch(instance: DagsterInstance, paths: Paths, lake: Lakehouse, opts: CycleOptions):
    """A terminal batch whose levels the curriculum draws from the policy's recent success per level
    (``tasks/curriculum.py``), with the choice recorded in its manifest. Returns (batch id, the choice)."""
    import random

    from tentalis_pipelines.envs.terminal_tasks import ALL_LEVELS, FAMILIES
    from tentalis_pipelines.tasks import curriculum

    if opts.task_source != "terminal":
        raise ValueError(f"the curriculum draws terminal levels; --tasks {opts.task_source!r} has none to draw (use --levels)")
    seed = opts.seed if opts.seed is not None else next_terminal_seed(paths.batches)
    choice = curriculum.plan(lake, opts.num_tasks, random.Random(f"tentalis-curriculum:{seed}"), levels=tuple(opts.levels) or ALL_LEVELS)
    batch_id = register_batch(instance, paths, num_tasks=opts.num_tasks, seed=seed, levels=choice.levels, task_source="terminal",
                              max_turns=opts.max_turns, recipe=opts.recipe, curriculum=choice.record(),
                              exclude_families=tuple(f for f in opts.exclude_families
                                                     if any(f in FAMILIES[lv] for lv in choice.levels)))
    return batch_id, choice


def _ensure_batch_partition(instance: DagsterInstance, batch_id: str) -> None:
    if not instance.has_dynamic_partition(task_batches.name, batch_id):
        instance.add_dynamic_partitions(task_batches.name, [batch_id])


def step_error(event) -> str:
    """A failed step's own error (a ``STEP_FAILURE`` event's), its first line: not the framework's wrapping."""
    error = event.step_failure_data.error
    while getattr(error, "cause", None) is not None:
        error = error.cause
    text = (error.message or "").strip().splitlines()
    return text[0] if text else error.cls_name


def failure_summary(result) -> str:
    """One line per failed step: its own error, not the framework's wrapping."""
    lines = []
    for ev in result.all_events:
        if ev.is_step_failure and ev.step_failure_data is not None:
            lines.append(f"{ev.step_key} failed: {step_error(ev)}")
    return "; ".join(lines)


def _listener(on_event: Callable[[Any], None]) -> Callable[[Any], None]:
    """``on_event`` as an instance's event listener: it is called inside the run's steps, so what it
    raises is dropped rather than failing the step (progress never fails a run)."""

    def listen(entry) -> None:
        with contextlib.suppress(Exception):
            on_event(entry)

    return listen


def run_job(defs: Definitions, instance: DagsterInstance, name: str, *, partition_key: str | None = None,
            run_config: dict | None = None, tags: dict[str, str] | None = None,
            on_event: Callable[[Any], None] | None = None) -> JobRun:
    """Execute one asset job in this process on ``instance``; raises :class:`CycleFailed` on failure.
    ``on_event`` is told every event of the run (an ``EventLogEntry``) the moment the instance stores it
    (``DagsterInstance.add_event_listener`` on the run's id): a step's end as it ends, not at the run's."""
    job = defs.resolve_job_def(name)
    run_id = str(uuid.uuid4())
    if on_event is not None:
        instance.add_event_listener(run_id, _listener(on_event))
    t0 = time.time()
    result = job.execute_in_process(run_config=run_config or {}, instance=instance, partition_key=partition_key,
                                    tags=tags or {}, run_id=run_id, raise_on_error=False)
    if not result.success:
        where = f" ({partition_key})" if partition_key else ""
        raise CycleFailed(f"{name}{where}: {failure_summary(result) or f'run {run_id} failed (see `tentalis ui`)'}")
    return JobRun(name, run_id, str(partition_key) if partition_key else None, time.time() - t0)


def resource_value(defs: Definitions, overrides: dict[str, Any], resource: str, name: str):
    """A resource field as a run with ``overrides`` sees it (run config over the definitions' value)."""
    cfg = overrides.get(resource, {}).get("config", {})
    return cfg[name] if name in cfg else getattr(defs.resources[resource], name)


def benchmark_partition(checkpoint_id: str, benchmark: str) -> MultiPartitionKey:
    return MultiPartitionKey({"checkpoint": checkpoint_id, "benchmark": benchmark})


def run_cycle(defs: Definitions, instance: DagsterInstance, paths: Paths, opts: CycleOptions,
              on_run: Callable[[JobRun], None] | None = None, on_start: Callable[[str], None] | None = None,
              on_note: Callable[[str], None] | None = None,
              on_event: Callable[[str, Any], None] | None = None) -> dict[str, Any]:
    """Run one cycle; returns the batch id, the new checkpoint (or None) and the gate's decision.
    ``on_start`` is told what a job is about to do, ``on_event`` each event of its run as it happens (the
    job's name and the ``EventLogEntry``: `tentalis run`'s progress lines), ``on_run`` its end.

    Without an explicit seed, a cycle first resumes the batch an interrupted cycle of the same shape left
    without trajectories (``interrupted_cycle_batch``; ``on_note`` is told), so a killed and resumed run
    trains on the same tasks in the same cycles as one never killed."""
    lake = Lakehouse(paths.lakehouse)
    cycle = f"cycle-{uuid.uuid4().hex[:12]}"
    tags = {"tentalis/trigger": opts.trigger, "tentalis/cycle": cycle}
    # A failure is summarised in one line by the caller; the full error and traceback stay in the run's
    # event log (`tentalis ui`), so the console logger prints nothing.
    config = {"resources": opts.resources, "loggers": {"console": {"config": {"log_level": "CRITICAL"}}}}
    runs: list[JobRun] = []

    def step(name: str, label: str, **kw) -> JobRun:
        if on_start:
            on_start(label)
        if on_event is not None:
            kw["on_event"] = functools.partial(on_event, name)
        run = run_job(defs, instance, name, run_config=kw.pop("run_config", config), tags=tags, **kw)
        runs.append(run)
        if on_run:
            on_run(run)
        return run

    resumed = None
    if opts.seed is None:
        resumed = interrupted_cycle_batch(paths.batches, task_source=opts.task_source, num_tasks=opts.num_tasks,
                                          levels=None if opts.curriculum else tuple(opts.levels), settled=settled_batches(lake, instance))
    if resumed is not None:
        batch_id = resumed
        _ensure_batch_partition(instance, batch_id)
        if on_note:
            on_note(f"resuming {batch_id}: an interrupted cycle registered it and wrote no trajectories")
    elif opts.curriculum:
        batch_id, choice = register_curriculum_batch(instance, paths, lake, opts)
        if on_note:
            on_note(f"curriculum: {batch_id} draws levels {dict(choice.record()['tasks_per_level'])} from recent success "
                    f"{ {k: f'{v:.0%}' for k, v in sorted(choice.success_by_level.items())} or 'none yet'}")
    elif (opts.task_source in ("arithmetic", "terminal", "bfcl", "swe") or is_task_file_source(opts.task_source)
          or opts.task_source in installed_environment_families()):
        batch_id = register_batch(instance, paths, num_tasks=opts.num_tasks, seed=opts.seed, levels=opts.levels,
                                  task_source=opts.task_source, max_turns=opts.max_turns, recipe=opts.recipe,
                                  exclude_families=opts.exclude_families)
    else:
        root = data_dir()
        if root is None:
            raise ValueError(f"task source {opts.task_source!r} reads its training split from TENTALIS_DATA_DIR, which is not set")
        batch_id = register_dataset_batch(paths.batches, root, opts.task_source, num_tasks=opts.num_tasks,
                                          recipe=family_recipe(opts.task_source, **opts.recipe))
        _ensure_batch_partition(instance, batch_id)
    step("rollout_job", f"rollouts, scores, reviews, trajectories of {batch_id}", partition_key=batch_id)
    if opts.skills:
        skills_run = {**config, "ops": {"skills": {"config": opts.skills_config}}} if opts.skills_config else config
        step("skills_job", f"skills from the failures of {batch_id}", partition_key=batch_id, run_config=skills_run)
    out: dict[str, Any] = {"batch_id": batch_id, "checkpoint_id": None, "decision": None, "runs": runs, "cycle": cycle,
                           "resumed": resumed is not None}
    if not opts.train:
        return out
    if fresh_trajectory_count(lake, paths) == 0:  # a batch the policy passes (or fails) alike in every group
        out["skipped"] = no_signal_note(lake, batch_id)
        if on_note:
            on_note(out["skipped"])
        return out
    before = _checkpoint_ids(lake)
    step("train_job", "training")
    new = [c for c in _checkpoint_ids(lake) if c not in before]
    if len(new) != 1:
        raise CycleFailed(f"train_job succeeded but wrote {len(new)} checkpoints: {new}")
    checkpoint_id = out["checkpoint_id"] = new[0]
    gate = resource_value(defs, opts.resources, "benchmark", "gate_benchmark")
    benchmarks = list(dict.fromkeys([gate, *resource_value(defs, opts.resources, "benchmark", "benchmarks")]))
    gated = resource_value(defs, opts.resources, "trainer", "promotion") == "gate"
    def benchmark(ref: str, benchmark: str, why: str = "") -> None:
        if not instance.has_dynamic_partition(checkpoint_ids.name, ref):
            instance.add_dynamic_partitions(checkpoint_ids.name, [ref])
        step("benchmark_job", f"{benchmark} of {ref}{why}", partition_key=benchmark_partition(ref, benchmark))

    for name in benchmarks:
        refs = promotion.missing_results(lake, checkpoint_id, name) if name == gate and gated else [checkpoint_id]
        for ref in refs:
            benchmark(ref, name)
        if name == gate and gated:
            # Known only now that the candidate's results are in: an incumbent measured with another skill set.
            for ref in promotion.missing_results(lake, checkpoint_id, name):
                benchmark(ref, name, " again, with the candidate's skills")
    if gated:
        gate_config = {**config, "ops": {"serving": {"config": {"checkpoint_id": checkpoint_id}}}}
        step("promotion_job", f"promotion gate for {checkpoint_id}", run_config=gate_config)
        out["decision"] = next(d for d in promotion.decisions(lake, gate) if d["checkpoint_id"] == checkpoint_id)
    return out


def no_signal_note(lake: Lakehouse, batch_id: str) -> str:
    """Why a cycle trains nothing: the batch's trajectories carry no learning signal (every group's
    rewards are equal), with their count and mean reward, so a saturated policy reads as one."""
    rows = lake.read("trajectories", batch_id=batch_id, columns=["reward", "kept"]).to_pylist() if lake.exists("trajectories") else []
    mean = sum(float(r["reward"]) for r in rows) / len(rows) if rows else 0.0
    return (f"{batch_id}: nothing to train on, no checkpoint this cycle: none of its {len(rows)} trajectories carries a learning "
            f"signal (every group's rewards are equal; mean reward {mean:.2f}). A policy that passes every task alike needs "
            "harder tasks (--levels); one that fails alike, easier tasks, more samples per task or a higher temperature")


def settled_batches(lake: Lakehouse, instance: DagsterInstance) -> set[str]:
    """Batches past their rollouts: their trajectories materialized (even as zero rows, so a batch whose
    every rollout was filtered is not retried forever), rows in ``trajectories``, or a checkpoint trained on them."""
    settled = set(instance.get_materialized_partitions(AssetKey("trajectories")))
    if lake.exists("trajectories"):
        settled.update(lake.read("trajectories", columns=["batch_id"]).column("batch_id").unique().to_pylist())
    if lake.exists("checkpoints"):
        for r in lake.read("checkpoints", columns=["trained_on"]).to_pylist():
            settled.update(r["trained_on"] or ())
    return settled


def _checkpoint_ids(lake: Lakehouse) -> list[str]:
    if not lake.exists("checkpoints"):
        return []
    return [r["checkpoint_id"] for r in lake.read("checkpoints", columns=["checkpoint_id"]).to_pylist()]
