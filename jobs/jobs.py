"""Asset jobs: one task batch, training, one benchmark partition, and the promotion gate.

A learning cycle is these jobs chained: by the automation in ``jobs/sensors.py`` (nightly batch ->
rollouts -> training -> benchmarks -> gate), or run one after another by ``tentalis run`` / ``learn``
and by CI (``jobs/cycle.py``). Every run belongs to its job, so the UI shows each stage's history.
"""

from dagster import AssetSelection, define_asset_job

from assets.batch_assets import reviews, rollouts, step_scores, tasks, trajectories
from assets.benchmark_assets import benchmark_results, learning_curve
from assets.partitions import task_batches
from assets.serving_assets import serving
from assets.skill_assets import skills
from assets.training_assets import checkpoints

rollout_job = define_asset_job(
    "rollout_job",
    selection=AssetSelection.assets(tasks, rollouts, step_scores, reviews, trajectories),
    partitions_def=task_batches,
    description="One task batch through rollouts, step scores, reviews and trajectories.",
)

train_job = define_asset_job(
    "train_job",
    selection=AssetSelection.assets(checkpoints),
    description="Train a LoRA checkpoint on the fresh trajectories of the serving policy.",
)

benchmark_job = define_asset_job(
    "benchmark_job",
    selection=AssetSelection.assets(benchmark_results),
    partitions_def=benchmark_results.partitions_def,
    description="One checkpoint on one benchmark (a (checkpoint, benchmark) partition).",
)

promotion_job = define_asset_job(
    "promotion_job",
    selection=AssetSelection.assets(serving, learning_curve),
    description="The promotion gate decides on a checkpoint from its benchmark results and moves the serving pointer on a pass; "
                "the learning curve is refreshed.",
)

skills_job = define_asset_job(
    "skills_job",
    selection=AssetSelection.assets(skills),
    partitions_def=task_batches,
    description="Distil one batch's failed reviews into skills; verify a candidate and re-check a verified skill (`tentalis learn --skills`).",
)
