"""Per-batch assets: tasks -> rollouts -> step_scores -> reviews -> trajectories (Delta tables)."""

from dagster import AssetExecutionContext, MaterializeResult, MetadataValue, asset

from assets.external import human_reviews
from assets.partitions import task_batches
from assets.table_metadata import table_definition_metadata, table_uri_metadata
from tentalis_pipelines import pipeline
from tentalis_pipelines.resources import LakehouseResource, PolicyResource, ReviewResource, TrainerResource


def stage_metadata(result: pipeline.StageResult, table: str, lake=None) -> dict:
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
        else:
            meta[k] = MetadataValue.text(str(v))
    return meta


def to_materialize_result(result: pipeline.StageResult, table: str, lake=None) -> MaterializeResult:
    return MaterializeResult(metadata=stage_metadata(result, table, lake))


@asset(partitions_def=task_batches, group_name="learning_loop", kinds={"delta"}, metadata=table_definition_metadata("tasks"))
def tasks(context: AssetExecutionContext, lakehouse: LakehouseResource, policy: PolicyResource) -> MaterializeResult:
    """The batch's tasks, from its snapshot (inbox file or seeded generator). Malformed lines, and prompts
    longer than `policy.max_prompt_tokens` of the policy's tokenizer, go to `quarantine`."""
    paths = lakehouse.paths()
    result = pipeline.build_tasks(lakehouse.lakehouse(), paths, context.partition_key, policy.settings())
    return to_materialize_result(result, "tasks", lakehouse.lakehouse())


@asset(partitions_def=task_batches, deps=[tasks], group_name="learning_loop", kinds={"delta", "pytorch"}, pool="gpu", metadata=table_definition_metadata("rollouts"))
def rollouts(context: AssetExecutionContext, lakehouse: LakehouseResource, policy: PolicyResource) -> MaterializeResult:
    """`num_generations` sampled answers per task from the serving checkpoint (the serving pointer; or the base model)."""
    res = pipeline.build_rollouts(lakehouse.lakehouse(), lakehouse.paths(), context.partition_key, policy.settings())
    return to_materialize_result(res, "rollouts", lakehouse.lakehouse())


@asset(partitions_def=task_batches, deps=[rollouts, tasks], group_name="learning_loop", kinds={"delta"}, metadata=table_definition_metadata("step_scores"))
def step_scores(context: AssetExecutionContext, lakehouse: LakehouseResource, review: ReviewResource) -> MaterializeResult:
    """One score per parsed step: the calculator verifier, or the LLM judge with majority vote."""
    judge = review.judge(lakehouse.paths().models) if review.step_scorer == "judge" else None
    res = pipeline.build_step_scores(lakehouse.lakehouse(), context.partition_key, scorer=review.step_scorer, judge=judge)
    return to_materialize_result(res, "step_scores", lakehouse.lakehouse())


@asset(partitions_def=task_batches, deps=[step_scores, rollouts, tasks, human_reviews], group_name="learning_loop", kinds={"delta"}, metadata=table_definition_metadata("reviews"))
def reviews(context: AssetExecutionContext, lakehouse: LakehouseResource, review: ReviewResource) -> MaterializeResult:
    """The manager's review of every rollout: score, critique and hint."""
    llm = review.llm_manager(lakehouse.paths().models) if review.manager == "llm" else None
    res = pipeline.build_reviews(lakehouse.lakehouse(), context.partition_key, review.manager, llm_manager=llm)
    return to_materialize_result(res, "reviews", lakehouse.lakehouse())


@asset(partitions_def=task_batches, deps=[reviews, step_scores, rollouts, tasks], group_name="learning_loop", kinds={"delta"}, metadata=table_definition_metadata("trajectories"))
def trajectories(
    context: AssetExecutionContext, lakehouse: LakehouseResource, policy: PolicyResource, trainer: TrainerResource
) -> MaterializeResult:
    """Training-ready samples: outcome, format, process and manager rewards, their weighted sum and the group advantage."""
    res = pipeline.build_trajectories(
        lakehouse.lakehouse(), context.partition_key, **trainer.trajectory_settings(policy.max_new_tokens)
    )
    return to_materialize_result(res, "trajectories", lakehouse.lakehouse())


@asset(partitions_def=task_batches, deps=[rollouts, tasks], group_name="learning_loop", kinds={"delta", "pytorch"}, pool="gpu", metadata=table_definition_metadata("step_labels"))
def step_labels(context: AssetExecutionContext, lakehouse: LakehouseResource, policy: PolicyResource) -> MaterializeResult:
    """Math-Shepherd Monte-Carlo step labels (fraction of k continuations from each step prefix that
    reach the right answer): training data for a learned PRM. Not part of rollout_job: materialise on demand."""
    res = pipeline.build_step_labels(lakehouse.lakehouse(), lakehouse.paths(), context.partition_key, policy.settings())
    return to_materialize_result(res, "step_labels", lakehouse.lakehouse())
