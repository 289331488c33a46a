"""A finished learning cycle's state ($TENTALIS_HOME with its lakehouse and Dagster instance), made
the way `tentalis run` makes it (``jobs.runner.run_cycle``: runs of the asset jobs on the instance that
`tentalis ui` reads), for the UI check. One function, so it follows when the cycle changes."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCHMARK = "arithmetic"


def build_finished_cycle(home: Path, model_dir: Path, *, num_tasks: int = 3, bench_limit: int = 4, next_batch: bool = True) -> dict:
    """One learning cycle on a persistent instance under ``home/dagster``:

    1. `tentalis run --no-train`: a seeded batch through ``rollout_job``;
    2. the manager's reviews: `tentalis import-reviews FILE` liked the first answer of each task (the
       random tiny model never answers right, so without them no group carries a learning signal), and
       the batch's ``reviews`` and ``trajectories`` are materialised again by a ``rollout_job`` run of
       those two assets (what "Materialize selected" in the UI does);
    3. `tentalis run`: the next batch (``rollout_job``), ``train_job``, ``benchmark_job`` of the new
       checkpoint and of the base model on the gate benchmark, ``promotion_job`` (``serving`` with its
       ``promotion_gate`` check, ``learning_curve``);
    4. (``next_batch``) `tentalis run --no-train` again: a batch sampled by the policy the gate left serving.

    Returns the batch ids (``next_batch_id`` None without it), the checkpoint id, the gate's decision
    and the run ids by job."""
    from dagster import AssetKey, DagsterInstance

    from jobs.runner import CycleOptions, run_cycle
    from tentalis_pipelines.definitions import defs
    from tentalis_pipelines.lakehouse import Lakehouse
    from tentalis_pipelines.settings import Paths
    from tentalis_pipelines.stages.human_reviews import import_human_reviews

    paths = Paths.from_env(home).ensure()
    shutil.copy(ROOT / "dagster.yaml", paths.dagster_home / "dagster.yaml")
    # Run config over the definitions' resources, as `tentalis run --num-generations 2 ...` passes it.
    resources = {
        "lakehouse": {"config": {"home": str(paths.home)}},
        "policy": {"config": {"model": str(model_dir), "num_generations": 2, "max_new_tokens": 8}},
        "review": {"config": {"manager": "human"}},
        "benchmark": {"config": {"limit": bench_limit, "max_new_tokens": 8, "benchmarks": [BENCHMARK], "gate_benchmark": BENCHMARK}},
    }
    lake = Lakehouse(paths.lakehouse)
    runs: dict[str, list[str]] = {}

    def cycle(instance, seed: int, train: bool) -> dict:
        opts = CycleOptions(num_tasks=num_tasks, seed=seed, levels=(1,), train=train, resources=resources, trigger="ui-check")
        return run_cycle(defs, instance, paths, opts, on_run=lambda r: runs.setdefault(r.job, []).append(r.run_id))

    with DagsterInstance.from_config(str(paths.dagster_home)) as instance:
        batch_id = cycle(instance, 1, train=False)["batch_id"]
        file = paths.home / f"reviews-{batch_id}.jsonl"
        file.write_text("".join(
            json.dumps({"rollout_id": r["rollout_id"], "score": 1.0, "critique": "clear", "reviewer": "ui-check"}) + "\n"
            for r in lake.read("rollouts", batch_id=batch_id).to_pylist() if r["group_index"] == 0))
        import_human_reviews(lake, file)
        result = defs.resolve_job_def("rollout_job").execute_in_process(
            run_config={"resources": resources, "loggers": {"console": {"config": {"log_level": "CRITICAL"}}}}, instance=instance, partition_key=batch_id,
            asset_selection=[AssetKey("reviews"), AssetKey("trajectories")], tags={"tentalis/trigger": "ui-check"})
        assert result.success, "re-materializing reviews and trajectories after the import failed"
        runs["rollout_job"].append(result.run_id)
        out = cycle(instance, 2, train=True)
        next_batch_id = cycle(instance, 3, train=False)["batch_id"] if next_batch else None
    return {"batch_id": batch_id, "trained_batch_id": out["batch_id"], "checkpoint_id": out["checkpoint_id"],
            "decision": out["decision"], "next_batch_id": next_batch_id, "runs": runs}
