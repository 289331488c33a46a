"""The grounding check of agent turns: flagged claims per batch (docs/grounding.md)."""

from functools import partial

from dagster import AssetExecutionContext, MaterializeResult, asset

from assets.batch_assets import rollouts, tasks, to_materialize_result
from assets.partitions import task_batches
from assets.resources import LakehouseResource, PolicyResource, ReviewResource
from assets.table_metadata import table_definition_metadata
from tentalis_pipelines.stages.grounding import build_grounding_flags


@asset(partitions_def=task_batches, deps=[rollouts, tasks], group_name="learning_loop", kinds={"delta"},
       metadata=table_definition_metadata("grounding_flags"))
def grounding_flags(context: AssetExecutionContext, lakehouse: LakehouseResource, policy: PolicyResource,
                    review: ReviewResource) -> MaterializeResult:
    """The claims (numbers, units, dates, paths, names) of each agent turn that the tool outputs and
    context of its session do not support, with their tokens; with `review.grounding_tagger` the MiniLM
    tagger's spans too. Written only when `review.grounding` is on; `trainer.grounding_policy` decides
    what training does with them. Not part of rollout_job: materialise it for a batch before training."""
    if not review.grounding:
        return MaterializeResult(metadata={"enabled": False, "why": "review.grounding is off: nothing was checked or written"})
    from transformers import AutoTokenizer

    from tentalis_pipelines.inference.models import resolve_model
    from tentalis_pipelines.reviewers import grounding_tagger

    lake = lakehouse.lakehouse()
    tokenizer = AutoTokenizer.from_pretrained(resolve_model(policy.model, lakehouse.paths().models))
    tagger = grounding_tagger.GroundingTagger.load(review.grounding_tagger) if review.grounding_tagger else None
    res = build_grounding_flags(lake, context.partition_key, tokenizer, detect=partial(grounding_tagger.detect, tagger=tagger))
    return to_materialize_result(res, "grounding_flags", lake)
