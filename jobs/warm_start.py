"""A warm start launched from Python (`tentalis warmstart`): a seeded environment batch, its oracle
demonstrations, a warm-start checkpoint, its benchmarks and the promotion gate, each a run of its own job.

The same jobs the sensors and CI run: ``demonstration_job`` (the batch's tasks and demonstrations, one
``task_batches`` partition), ``warm_start_job``, ``benchmark_job`` for the gate benchmark of the new
checkpoint (and of the incumbent when it has no result yet) and ``promotion_job``. Nothing here
re-implements a stage, and nothing promotes the checkpoint but the gate.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from dagster import DagsterInstance, Definitions

from assets.partitions import checkpoint_ids
from jobs.runner import JobRun, benchmark_partition, register_batch, resource_value, run_job
from tentalis_pipelines import promotion
from tentalis_pipelines.lakehouse import Lakehouse
from tentalis_pipelines.settings import Paths


@dataclass
class WarmStartOptions:
    """The batch to demonstrate (an environment's seeded training tasks) and the warm start's settings."""

    task_source: str = "terminal"  # terminal | bfcl | swe
    num_tasks: int = 16
    seed: int | None = None
    levels: tuple[int, ...] = (1,)
    max_turns: int = 8
    epochs: int = 3
    learning_rate: float = 1e-4
    gate: bool = True  # benchmark the checkpoint and run the promotion gate
    exclude_families: tuple[str, ...] = ()  # terminal: task kinds never demonstrated (held out whole)
    run_seed: int = 0  # the shuffling of the demonstrations and the LoRA's initialisation (the trainer's seed)
    resources: dict[str, Any] = field(default_factory=dict)


def run_warm_start(defs: Definitions, instance: DagsterInstance, paths: Paths, opts: WarmStartOptions,
                   on_run: Callable[[JobRun], None] | None = None) -> dict[str, Any]:
    """Run the warm start's jobs (module doc); returns the batch, the checkpoint and the gate's decision."""
    if opts.task_source not in ("terminal", "bfcl", "swe"):
        raise ValueError(f"a warm start demonstrates environment tasks: terminal, bfcl or swe (got {opts.task_source!r})")
    lake = Lakehouse(paths.lakehouse)
    tags = {"tentalis/trigger": "warmstart", "tentalis/cycle": f"warmstart-{uuid.uuid4().hex[:12]}"}
    resources = {**opts.resources, "trainer": {"config": {**opts.resources.get("trainer", {}).get("config", {}), "seed": opts.run_seed}}}
    config = {"resources": resources, "loggers": {"console": {"config": {"log_level": "CRITICAL"}}}}

    def step(name: str, **kw) -> JobRun:
        run = run_job(defs, instance, name, run_config=kw.pop("run_config", config), tags=tags, **kw)
        if on_run:
            on_run(run)
        return run

    batch_id = register_batch(instance, paths, num_tasks=opts.num_tasks, seed=opts.seed, levels=opts.levels,
                              task_source=opts.task_source, max_turns=opts.max_turns, exclude_families=opts.exclude_families)
    step("demonstration_job", partition_key=batch_id)
    before = {r["checkpoint_id"] for r in lake.read("checkpoints", columns=["checkpoint_id"]).to_pylist()} if lake.exists("checkpoints") else set()
    warm = {"batches": [batch_id], "epochs": opts.epochs, "learning_rate": opts.learning_rate, "seed": opts.run_seed}
    step("warm_start_job", run_config={**config, "ops": {"warm_start": {"config": warm}}})
    new = sorted({r["checkpoint_id"] for r in lake.read("checkpoints", columns=["checkpoint_id"]).to_pylist()} - before)
    if len(new) != 1:
        raise RuntimeError(f"warm_start_job succeeded but wrote {len(new)} checkpoints: {new}")
    checkpoint_id = new[0]
    out: dict[str, Any] = {"batch_id": batch_id, "checkpoint_id": checkpoint_id, "decision": None}
    if not opts.gate:
        return out
    gate = resource_value(defs, opts.resources, "benchmark", "gate_benchmark")
    for ref in promotion.missing_results(lake, checkpoint_id, gate):
        if not instance.has_dynamic_partition(checkpoint_ids.name, ref):
            instance.add_dynamic_partitions(checkpoint_ids.name, [ref])
        step("benchmark_job", partition_key=benchmark_partition(ref, gate))
    step("promotion_job", run_config={**config, "ops": {"serving": {"config": {"checkpoint_id": checkpoint_id}}}})
    out["decision"] = next(d for d in promotion.decisions(lake, gate) if d["checkpoint_id"] == checkpoint_id)
    return out
