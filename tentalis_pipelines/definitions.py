"""The composition root: every asset, job, sensor, schedule and resource of Tentalis."""

from __future__ import annotations

from dagster import Definitions

from assets.batch_assets import (
    guided_rollouts,
    reviews,
    rollouts,
    step_labels,
    step_scores,
    tasks,
    teacher_logprobs,
    trajectories,
)
from assets.benchmark_assets import benchmark_results, hint_efficacy, learning_curve, prm_evaluation
from assets.demonstration_assets import demonstrations, warm_start
from assets.external import human_reviews, reward_activations
from assets.forensics_checks import FORENSICS_CHECKS
from assets.grounding_assets import grounding_flags
from assets.idle_assets import training_windows
from assets.resources import (
    BenchmarkResource,
    CycleResource,
    LakehouseResource,
    PolicyResource,
    ReviewResource,
    TrainerResource,
    env_or,
)
from assets.serving_assets import serving
from assets.skill_assets import skills
from assets.training_assets import checkpoints
from assets.trust_assets import judge_agreement, reward_versions
from jobs.jobs import (
    benchmark_job,
    demonstration_job,
    idle_train_job,
    judge_agreement_job,
    promotion_job,
    rescore_job,
    rollout_job,
    skills_job,
    train_job,
    warm_start_job,
)
from jobs.maintenance import maintain_lakehouse_job, weekly_lakehouse_maintenance
from jobs.sensors import (
    fresh_sessions,
    fresh_trajectories,
    gate_ready,
    idle_window,
    new_checkpoints,
    nightly_learning_cycle,
    task_inbox,
)
from tentalis_pipelines.redact import install_log_filter

# Secrets never reach a log line: every process that loads the definitions redacts its log records.
install_log_filter()

defs = Definitions(
    assets=[human_reviews, tasks, rollouts, step_scores, step_labels, reviews, teacher_logprobs, guided_rollouts, trajectories, checkpoints, training_windows, benchmark_results, serving,
            learning_curve, hint_efficacy, prm_evaluation, reward_activations, reward_versions, judge_agreement, skills, grounding_flags,
            demonstrations, warm_start],
    asset_checks=FORENSICS_CHECKS,
    jobs=[rollout_job, train_job, idle_train_job, benchmark_job, promotion_job, maintain_lakehouse_job, rescore_job, judge_agreement_job, skills_job,
          demonstration_job, warm_start_job],
    sensors=[task_inbox, fresh_sessions, fresh_trajectories, idle_window, new_checkpoints, gate_ready],
    schedules=[nightly_learning_cycle, weekly_lakehouse_maintenance],
    resources={
        "lakehouse": LakehouseResource(home=env_or("TENTALIS_HOME", None)),
        # model and base_url default to $TENTALIS_MODEL / $OPENAI_BASE_URL when the resource is used.
        "policy": PolicyResource(),
        "review": ReviewResource(),
        "trainer": TrainerResource(),
        "benchmark": BenchmarkResource(),
        "cycle": CycleResource(),
    },
)
