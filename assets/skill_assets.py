"""Skills from failures: lessons distilled from a batch's low-scored reviews, verified on held-out items."""

from dagster import AssetExecutionContext, Config, MaterializeResult, MetadataValue, asset
from pydantic import Field

from assets.batch_assets import reviews, rollouts, stage_metadata, tasks
from assets.partitions import task_batches
from assets.resources import LakehouseResource, PolicyResource, ReviewResource
from assets.serving_assets import serving
from assets.table_metadata import table_definition_metadata
from tentalis_pipelines.skills.library import SkillSettings
from tentalis_pipelines.stages.rollouts import current_policy
from tentalis_pipelines.stages.skills import build_skills

_D = SkillSettings()


class SkillsConfig(Config):
    """How skills are distilled and verified (:class:`~tentalis_pipelines.skills.library.SkillSettings`)."""

    threshold: float = Field(_D.threshold, description="reviews scored below this are failures to learn from")
    merge_cosine: float = Field(_D.merge_cosine, description="skills at least this similar (cosine) merge into one")
    verify_per_cycle: int = Field(_D.verify_per_cycle, description="candidates verified per run (most supported first)")
    recheck_per_cycle: int = Field(_D.recheck_per_cycle, description="verified skills re-checked per run (oldest measurement first)")
    validation_source: str = Field(_D.validation_source, description="arithmetic, or a dataset (gsm8k) whose reserved train tail "
                                   "is the validation set; the task source the skills come from")
    validation_items: int = Field(_D.validation_items, description="items of the validation set")
    validation_seed: int = Field(_D.validation_seed, description="generator seed of the validation set (not a training or gate seed)")
    min_ci_low: float = Field(_D.min_ci_low, description="verify only when the gain's 95% interval lower end is at least this")
    min_net_wins: int = Field(_D.min_net_wins, description="verify only when the skill wins on at least this many more items than it loses")
    max_new_tokens: int = Field(_D.max_new_tokens, description="completion length of the validation answers")
    verify: bool = Field(True, description="measure candidates and verified skills (False: distil only)")


@asset(partitions_def=task_batches, deps=[reviews, rollouts, tasks, serving], group_name="learning_loop", kinds={"delta", "pytorch"},
       pool="gpu", metadata=table_definition_metadata("skills"))
def skills(context: AssetExecutionContext, config: SkillsConfig, lakehouse: LakehouseResource, policy: PolicyResource,
           review: ReviewResource) -> MaterializeResult:
    """The batch's low-scored reviews distilled into one-sentence skills (a template per failure type, or
    the llm manager's model when the manager is `llm`), merged with near-duplicates; then the most
    supported candidate is verified, and the oldest verified skill re-checked, by a paired greedy
    comparison on validation items with and without it (every decision a `skill_decisions` row)."""
    lake, paths = lakehouse.lakehouse(), lakehouse.paths()
    settings = SkillSettings(**{k: v for k, v in config.model_dump().items() if k != "verify"})
    llm = None
    if review.manager == "llm":
        from tentalis_pipelines.skills.llm_distiller import LLMDistiller

        llm = LLMDistiller(review.llm_manager(paths.models).backend)
    version, adapter = current_policy(lake, paths)
    policy_settings = policy.settings()

    def make_backend():
        from tentalis_pipelines.inference.models import resolve_model

        return policy_settings.make_backend(resolve_model(policy_settings.model, paths.models), adapter)

    res = build_skills(lake, context.partition_key, settings, policy_version=version if config.verify else None,
                                make_backend=make_backend if config.verify else None, llm=llm)
    meta = stage_metadata(res, "skills", lake)
    meta["policy_version"] = MetadataValue.text(version)
    return MaterializeResult(metadata=meta)
