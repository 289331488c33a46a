"""Per-batch assets: tasks -> rollouts -> step_scores -> reviews -> (teacher_logprobs, guided_rollouts) -> trajectories."""

import json
from functools import partial

from dagster import (
    AssetCheckResult,
    AssetCheckSeverity,
    AssetCheckSpec,
    AssetExecutionContext,
    MaterializeResult,
    MetadataValue,
    asset,
)

from assets.external import human_reviews, reward_activations
from assets.partitions import task_batches
from assets.resources import LakehouseResource, PolicyResource, ReviewResource, TrainerResource
from assets.table_metadata import table_definition_metadata, table_uri_metadata
from tentalis_pipelines import contamination, quality
from tentalis_pipelines.evaluation.plots import reward_plots
from tentalis_pipelines.stages.common import StageResult
from tentalis_pipelines.stages.guided_rollouts import build_guided_rollouts
from tentalis_pipelines.stages.kinds import one_review_per_rollout, rollouts_per_task
from tentalis_pipelines.stages.reviews import build_reviews
from tentalis_pipelines.stages.rollouts import build_rollouts
from tentalis_pipelines.stages.step_labels import build_step_labels
from tentalis_pipelines.stages.step_scores import build_step_scores
from tentalis_pipelines.stages.tasks import SCREEN_KEY, build_tasks
from tentalis_pipelines.stages.teacher_logprobs import build_teacher_logprobs
from tentalis_pipelines.stages.trajectories import build_trajectories
from tentalis_pipelines.tasks.families import batch_policy
from tentalis_pipelines.training import serving


def stage_metadata(result: StageResult, table: str, lake=None) -> dict:
    """A stage's numbers and previews as Dagster metadata (markdown tables render on the asset page),
    with the standard row count and, given the lakehouse, the table's URI."""
    meta = {"dagster/row_count": MetadataValue.int(result.rows), "table": MetadataValue.text(table)}
    if lake is not None:
        meta.update(table_uri_metadata(lake, table))
    for k, v in result.metadata.items():
        if v is None:
            continue
        if isinstance(v, str) and ("|" in v or "\n" in v):
            meta[k] = MetadataValue.md(v)
        elif isinstance(v, bool):
            meta[k] = MetadataValue.bool(v)
        elif isinstance(v, int):
            meta[k] = MetadataValue.int(v)
        elif isinstance(v, float):
            meta[k] = MetadataValue.float(v)
        elif isinstance(v, dict | list) and _is_json(v):  # structured figures stay structured (the UI shows a tree)
            meta[k] = MetadataValue.json(v)
        else:
            meta[k] = MetadataValue.text(str(v))
    return meta


def _is_json(value) -> bool:
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):
        return False
    return True


def to_materialize_result(result: StageResult, table: str, lake=None, checks=()) -> MaterializeResult:
    return MaterializeResult(metadata=stage_metadata(result, table, lake), check_results=list(checks))


def check_result(name: str, outcome: quality.CheckOutcome) -> AssetCheckResult:
    """A data-quality outcome as a Dagster check result (a failure is an ERROR: it says the data is wrong)."""
    meta = {k: MetadataValue.int(v) if isinstance(v, int)
            else MetadataValue.md(v) if isinstance(v, str) and "\n|" in v
            else MetadataValue.text(str(v)) for k, v in outcome.metadata.items()}
    return AssetCheckResult(check_name=name, passed=outcome.passed, description=outcome.description, metadata=meta,
                            severity=AssetCheckSeverity.ERROR)


@asset(partitions_def=task_batches, group_name="learning_loop", kinds={"delta"}, metadata=table_definition_metadata("tasks"),
       check_specs=[AssetCheckSpec("no_held_out_items", asset="tasks", blocking=True, description="No task is a held-out gate or benchmark item, exactly or as a near duplicate (normalised text, 13-gram containment, MiniLM embedding); contaminated tasks are quarantined at load, this confirms none remain and fails closed when the benchmark index cannot be built.")])
def tasks(context: AssetExecutionContext, lakehouse: LakehouseResource, policy: PolicyResource) -> MaterializeResult:
    """The batch's tasks, from its snapshot (inbox file or seeded generator). Malformed lines, prompts
    longer than `policy.max_prompt_tokens` of the policy's tokenizer, and benchmark items go to `quarantine`;
    `contamination_screen` names the benchmarks screened against and those skipped (data not installed)."""
    paths = lakehouse.paths()
    lake = lakehouse.lakehouse()
    result = build_tasks(lake, paths, context.partition_key, policy.settings())
    checks = [check_result("no_held_out_items", quality.no_held_out_items(lake, context.partition_key,
                                                                         cache_dir=contamination.default_cache_dir(paths.home)))]
    # Which benchmarks the batch was screened against, and which not (their data is not installed) and why.
    screen = result.metadata.pop(SCREEN_KEY)
    for name, why in screen["skipped"].items():
        context.log.warning(f"not screened against {name}: {why}")
    meta = stage_metadata(result, "tasks", lake)
    meta[SCREEN_KEY] = MetadataValue.json(screen)
    return MaterializeResult(metadata=meta, check_results=checks)


@asset(partitions_def=task_batches, deps=[tasks], group_name="learning_loop", kinds={"delta", "pytorch"}, pool="gpu", metadata=table_definition_metadata("rollouts"),
       check_specs=[AssetCheckSpec("rollouts_per_task", asset="rollouts", description="Every task has exactly num_generations rollouts.")])
def rollouts(context: AssetExecutionContext, lakehouse: LakehouseResource, policy: PolicyResource) -> MaterializeResult:
    """`num_generations` sampled answers per task from the serving checkpoint (the serving pointer; or the base model)."""
    lake, settings = lakehouse.lakehouse(), batch_policy(lakehouse.paths().batches, context.partition_key, policy.settings())
    res = build_rollouts(lake, lakehouse.paths(), context.partition_key, settings)  # sampled with the batch's recipe
    checks = [check_result("rollouts_per_task", rollouts_per_task(lake, context.partition_key, settings.num_generations))]
    return to_materialize_result(res, "rollouts", lake, checks)


@asset(partitions_def=task_batches, deps=[rollouts, tasks], group_name="learning_loop", kinds={"delta"}, metadata=table_definition_metadata("step_scores"))
def step_scores(context: AssetExecutionContext, lakehouse: LakehouseResource, review: ReviewResource) -> MaterializeResult:
    """One score per parsed step: the calculator verifier, or the LLM judge with majority vote."""
    judge = review.step_judge(lakehouse.paths())
    res = build_step_scores(lakehouse.lakehouse(), context.partition_key, scorer=review.step_scorer, judge=judge)
    return to_materialize_result(res, "step_scores", lakehouse.lakehouse())


@asset(partitions_def=task_batches, deps=[step_scores, rollouts, tasks, human_reviews], group_name="learning_loop", kinds={"delta"}, metadata=table_definition_metadata("reviews"),
       check_specs=[AssetCheckSpec("one_review_per_rollout", asset="reviews", description="Every rollout has exactly one review, and every review names a rollout of the batch.")])
def reviews(context: AssetExecutionContext, lakehouse: LakehouseResource, review: ReviewResource) -> MaterializeResult:
    """The manager's review of every rollout: score, critique and hint. A live-sessions batch: the live
    reviews of its sessions, and with `review.manager = llm` the judge's review of each session no person reviewed."""
    # Built on first use: a sessions batch whose sessions all have a person's review loads no judge model.
    lake = lakehouse.lakehouse()
    llm = None
    if review.manager == "llm":  # the serving manager: a trained adapter once one is promoted (training/manager_rl.py)
        version, adapter = serving.serving_policy(lake, "manager")
        llm = partial(review.llm_manager, lakehouse.paths().models, adapter_dir=adapter, version=version)
    res = build_reviews(lake, context.partition_key, review.manager, llm_manager=llm)
    checks = [check_result("one_review_per_rollout", one_review_per_rollout(lake, context.partition_key))]
    return to_materialize_result(res, "reviews", lake, checks)


@asset(partitions_def=task_batches, deps=[reviews, rollouts, tasks], group_name="learning_loop", kinds={"delta", "pytorch"}, pool="gpu",
       metadata=table_definition_metadata("teacher_logprobs"))
def teacher_logprobs(
    context: AssetExecutionContext, lakehouse: LakehouseResource, policy: PolicyResource, trainer: TrainerResource
) -> MaterializeResult:
    """Hinted on-policy distillation's teacher: per rollout, the hint filter's decision, and for kept hints the
    log-probs of the student's own tokens under the policy given the hint and without it (off when trainer.w_opd = 0)."""
    lake = lakehouse.lakehouse()
    settings = policy.settings()
    res = build_teacher_logprobs(lake, lakehouse.paths(), context.partition_key, settings,
                                          trainer.config(settings.max_new_tokens))
    return to_materialize_result(res, "teacher_logprobs", lake)


@asset(partitions_def=task_batches, deps=[reviews, rollouts, step_scores, tasks], group_name="learning_loop", kinds={"delta", "pytorch"}, pool="gpu",
       metadata=table_definition_metadata("guided_rollouts"))
def guided_rollouts(
    context: AssetExecutionContext, lakehouse: LakehouseResource, policy: PolicyResource, trainer: TrainerResource
) -> MaterializeResult:
    """Hint-guided resampling (`tentalis learn --method guide`): each group in which every sample failed is
    resampled with its manager's hint in the context; the correct samples train the student without the hint,
    weighted by the ratio to the hinted behaviour policy (off when trainer.guide = false)."""
    lake = lakehouse.lakehouse()
    settings = batch_policy(lakehouse.paths().batches, context.partition_key, policy.settings())  # the batch's recipe
    res = build_guided_rollouts(lake, lakehouse.paths(), context.partition_key, settings, trainer.config(settings.max_new_tokens))
    return to_materialize_result(res, "guided_rollouts", lake)


@asset(partitions_def=task_batches, deps=[reviews, teacher_logprobs, guided_rollouts, step_scores, rollouts, tasks, reward_activations],
       group_name="learning_loop", kinds={"delta"},
       metadata=table_definition_metadata("trajectories"),
       check_specs=[AssetCheckSpec("rewards_in_range", asset="trajectories", description="Rewards and advantages finite; outcome, format and manager scores in [0, 1].")])
def trajectories(
    context: AssetExecutionContext, lakehouse: LakehouseResource, policy: PolicyResource, trainer: TrainerResource,
    review: ReviewResource,
) -> MaterializeResult:
    """Training-ready samples: outcome, format, process and manager rewards, their weighted sum and the group
    advantage; with a plot of the mean and the outcome reward per policy version over every batch."""
    lake = lakehouse.lakehouse()
    res = build_trajectories(lake, context.partition_key, **trainer.trajectory_settings(policy.max_new_tokens),
                                      weights=review.weights())
    checks = [check_result("rewards_in_range", quality.rewards_in_range(lake, context.partition_key))]
    meta = stage_metadata(res, "trajectories", lake)
    # Every batch's rows: how the reward moved from one policy version to the next.
    rows = lake.read("trajectories", columns=["policy_version", "reward", "outcome_reward", "created_at"]).to_pylist()
    meta.update({k: MetadataValue.md(v) for k, v in reward_plots(rows).items()})
    return MaterializeResult(metadata=meta, check_results=checks)


@asset(partitions_def=task_batches, deps=[rollouts, tasks], group_name="learning_loop", kinds={"delta", "pytorch"}, pool="gpu", metadata=table_definition_metadata("step_labels"))
def step_labels(context: AssetExecutionContext, lakehouse: LakehouseResource, policy: PolicyResource) -> MaterializeResult:
    """Math-Shepherd Monte-Carlo step labels (fraction of k continuations from each step prefix that
    reach the right answer): training data for a learned PRM. Not part of rollout_job: materialise on demand."""
    res = build_step_labels(lakehouse.lakehouse(), lakehouse.paths(), context.partition_key, policy.settings())
    return to_materialize_result(res, "step_labels", lakehouse.lakehouse())
