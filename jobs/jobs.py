"""Asset jobs: one task batch, training, one benchmark partition, and the promotion gate.

A learning cycle is these jobs chained: by the automation in ``jobs/sensors.py`` (nightly batch ->
rollouts -> training -> benchmarks -> gate), or run one after another by ``tentalis run`` / ``learn``
and by CI (``jobs/runner.py``). Every run belongs to its job, so the UI shows each stage's history.
"""

from dagster import AssetSelection, define_asset_job

from assets.batch_assets import (
    guided_rollouts,
    reviews,
    rollouts,
    step_scores,
    tasks,
    teacher_logprobs,
    trajectories,
)
from assets.benchmark_assets import benchmark_results, hint_efficacy, learning_curve
from assets.demonstration_assets import demonstrations, warm_start
from assets.idle_assets import training_windows
from assets.partitions import task_batches
from assets.serving_assets import serving
from assets.skill_assets import skills
from assets.training_assets import checkpoints
from assets.trust_assets import judge_agreement, reward_versions

rollout_job = define_asset_job(
    "rollout_job",
    selection=AssetSelection.assets(tasks, rollouts, step_scores, reviews, teacher_logprobs, guided_rollouts, trajectories),
    partitions_def=task_batches,
    description="One task batch through rollouts, step scores, reviews, the OPD teacher, hint-guided resampling and trajectories.",
)

train_job = define_asset_job(
    "train_job",
    selection=AssetSelection.assets(checkpoints),
    description="Train a LoRA checkpoint on the fresh trajectories of the serving policy.",
)

idle_train_job = define_asset_job(
    "idle_train_job",
    selection=AssetSelection.assets(training_windows),
    description="Train while the gateway is idle (sensor idle_window): resume the saved progress or start on the fresh "
                "trajectories, yield when a request arrives; one training_windows row per window.",
)

benchmark_job = define_asset_job(
    "benchmark_job",
    selection=AssetSelection.assets(benchmark_results),
    partitions_def=benchmark_results.partitions_def,
    description="One checkpoint on one benchmark (a (checkpoint, benchmark) partition).",
)

promotion_job = define_asset_job(
    "promotion_job",
    selection=AssetSelection.assets(serving, learning_curve, hint_efficacy),
    description="The promotion gate decides on a checkpoint from its benchmark results and moves the serving pointer on a pass; "
                "the learning curve and the hint efficacy are refreshed.",
)

rescore_job = define_asset_job(
    "rescore_job",
    selection=AssetSelection.assets(reward_versions),
    description="Re-score the stored rollouts into a new reward version and show its diff (run config: the version's "
                "definition); training keeps the active version until `tentalis rescore --activate`.",
)

judge_agreement_job = define_asset_job(
    "judge_agreement_job",
    selection=AssetSelection.assets(judge_agreement),
    description="Judge-versus-manager agreement per judge, rubric and window, and the drift check.",
)

skills_job = define_asset_job(
    "skills_job",
    selection=AssetSelection.assets(skills),
    partitions_def=task_batches,
    description="Distil one batch's failed reviews into skills; verify a candidate and re-check a verified skill (`tentalis learn --skills`).",
)

demonstration_job = define_asset_job(
    "demonstration_job",
    selection=AssetSelection.assets(tasks, demonstrations),
    partitions_def=task_batches,
    description="One batch's tasks and the oracle's demonstrations of them, each replayed and verified in its environment.",
)

warm_start_job = define_asset_job(
    "warm_start_job",
    selection=AssetSelection.assets(warm_start),
    description="A warm-start LoRA checkpoint: a supervised loss on the verified demonstrations' assistant turns; the "
                "benchmarks and the promotion gate decide on it like on any checkpoint.",
)
