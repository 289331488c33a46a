"""The training launchers' overhead, side by side: one cycle's training through `in_process`, `subprocess`
(Dagster Pipes) and `ray` (a Ray job on a local Ray cluster), on copies of the same lakehouse.

    python -m bench.launcher_bench                       # a default `make run` cycle: 16 tasks x 4 samples, SmolLM2
    python -m bench.launcher_bench --model tiny --tasks 8 # the tiny random Llama, in seconds

One cycle (tasks -> rollouts -> step_scores -> reviews -> trajectories) runs once through Dagster and is timed;
its home is copied once per launcher, and each copy's `checkpoints` asset is materialised through Dagster with
that launcher (alternated over ``--repeats`` rounds). Reported per launcher: the `checkpoints` step's wall
time, its overhead over in-process, and that overhead as a share of the whole cycle (the batch's assets plus
the in-process training step). The Ray cluster starts before timing (its start-up is a cluster's, not a
launch's). Figures and the host CPU go to a JSON file. The lab, not the product.
"""

from __future__ import annotations

import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import typer

app = typer.Typer(add_completion=False)


def _resources(home: Path, model: str, trainer_kw: dict, num_generations: int):
    from assets.resources import (
        LakehouseResource,
        PolicyResource,
        ReviewResource,
        TrainerResource,
    )

    return {"lakehouse": LakehouseResource(home=str(home)), "review": ReviewResource(),
            "policy": PolicyResource(model=model, num_generations=num_generations),
            "trainer": TrainerResource(**trainer_kw)}


@app.command()
def main(
    model: str = typer.Option("embedded", help="'embedded' (SmolLM2-135M, `make run`'s), 'tiny' (a 2-layer random Llama) or a model folder."),
    tasks: int = typer.Option(16, help="Tasks in the cycle's batch (`make run`: 16)."),
    num_generations: int = typer.Option(4, help="Samples per task (`make run`: 4)."),
    launchers: str = typer.Option("in_process,subprocess,ray", help="Which launchers, comma-separated."),
    repeats: int = typer.Option(1, help="Rounds of all launchers, alternated (the median is reported)."),
    out: Path | None = typer.Option(None, help="JSON output (default: <work dir>/launcher_bench.json)."),
    workdir: Path | None = typer.Option(None, help="Where the cycle's homes go (default: a temp folder, removed after)."),
):
    from dagster import DagsterInstance, materialize

    from assets.batch_assets import reviews, rollouts, step_scores, trajectories
    from assets.batch_assets import tasks as tasks_asset
    from assets.training_assets import checkpoints
    from tentalis_pipelines.hardware import host_cpu
    from tentalis_pipelines.inference.models import build_tiny_llama, resolve_model
    from tentalis_pipelines.settings import Paths
    from tentalis_pipelines.tasks.batches import register_generated_batch

    names = [n.strip() for n in launchers.split(",") if n.strip()]
    root = Path(workdir or tempfile.mkdtemp(prefix="launcher-bench-"))
    root.mkdir(parents=True, exist_ok=True)
    base = root / "cycle"
    paths = Paths.from_env(base).ensure()
    shared_models = Path(Paths.from_env().models)  # the usual model cache: conversion happens once per machine
    if model == "tiny":
        model_dir = str(build_tiny_llama(resolve_model("embedded", shared_models), shared_models / "tiny-llama"))
    else:
        model_dir = str(resolve_model(model, shared_models))

    batch_id = register_generated_batch(paths.batches, seed=11, num_tasks=tasks)
    with DagsterInstance.ephemeral() as instance:
        instance.add_dynamic_partitions("task_batches", [batch_id])
        t0 = time.perf_counter()
        res = materialize([tasks_asset, rollouts, step_scores, reviews, trajectories], partition_key=batch_id, instance=instance,
                          resources=_resources(base, model_dir, {}, num_generations))
        batch_s = time.perf_counter() - t0
    assert res.success
    print(f"cycle batch ({tasks} tasks x {num_generations}): {batch_s:.1f} s", file=sys.stderr)

    cluster = None
    if "ray" in names:
        from tests.local_servers import (
            RayCluster,  # the lab's local Ray cluster (run from the repository root)
        )

        cluster = RayCluster().start()
    timings: dict[str, list[float]] = {n: [] for n in names}
    try:
        for r in range(repeats):
            for name in names:
                home = root / f"{name}-{r}"
                shutil.copytree(base, home)
                extra = {"ray_address": cluster.address, "ray_python": sys.executable} if name == "ray" else {}
                with DagsterInstance.ephemeral() as instance:
                    t0 = time.perf_counter()
                    res = materialize([checkpoints], instance=instance,
                                      resources=_resources(home, model_dir, {"launcher": name, **extra}, num_generations))
                    timings[name].append(time.perf_counter() - t0)
                assert res.success, name
                print(f"round {r} {name}: {timings[name][-1]:.1f} s", file=sys.stderr)
                shutil.rmtree(home, ignore_errors=True)
    finally:
        if cluster is not None:
            cluster.stop()
    med = {n: statistics.median(v) for n, v in timings.items()}
    ref = med.get("in_process")
    cycle_s = batch_s + (ref or 0.0)
    rows = []
    for n in names:
        over = None if ref is None else med[n] - ref
        rows.append({"launcher": n, "train_step_s": round(med[n], 2), "all_s": [round(x, 2) for x in timings[n]],
                     "ratio_to_in_process": None if ref is None else round(med[n] / ref, 3),
                     "overhead_s": None if over is None else round(over, 2),
                     "overhead_share_of_cycle": None if over is None else round(over / cycle_s, 4)})
    result = {"bench": "launcher_bench", "host_cpu": host_cpu(), "model": model, "tasks": tasks, "num_generations": num_generations,
              "repeats": repeats, "cycle_batch_s": round(batch_s, 2), "cycle_s": round(cycle_s, 2), "launchers": rows,
              "command": " ".join(["python -m bench.launcher_bench", *sys.argv[1:]])}
    out = out or root / "launcher_bench.json"
    out.write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))
    if workdir is None:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    app()
