"""Trust in the reward: re-scoring stored rollouts into reward versions, and how the automatic
reviewers agree with the human managers over time."""

from dagster import (
    AssetCheckResult,
    AssetCheckSeverity,
    AssetCheckSpec,
    AssetExecutionContext,
    Config,
    MaterializeResult,
    MetadataValue,
    asset,
)
from pydantic import Field

from assets.batch_assets import reviews, rollouts, stage_metadata, step_scores, tasks, trajectories
from assets.external import human_reviews
from assets.resources import LakehouseResource, PolicyResource, ReviewResource, TrainerResource
from assets.table_metadata import table_definition_metadata
from tentalis_pipelines.evaluation.plots import agreement_inline_markdown, rescore_inline_markdown
from tentalis_pipelines.rewards.agreement import DriftSettings
from tentalis_pipelines.rewards.rescore import RescoreSpec
from tentalis_pipelines.rewards.scoring import parse_weight_overrides
from tentalis_pipelines.stages.judge_agreement import build_judge_agreement
from tentalis_pipelines.stages.rescore import read_version, rescore


class RescoreConfig(Config):
    """A new reward version of the stored rollouts (nothing is sampled again)."""

    version: str = Field(description="name of the new reward version, e.g. v1")
    weights: str = Field("", description='JSON weight overrides: {"manager": 1.0} (every environment) or {"math": {"format": 0.0}}')
    manager: str = Field("stored", description="stored (keep the reviews' scores), verifier or llm (review.judge_model)")
    step_scorer: str = Field("stored", description="stored, calculator, judge (review.judge_model, review.num_votes) or prm_head")
    rubric: str = Field("", description="the llm manager's rubric text (empty: its default rubric)")
    rubric_name: str = Field("default", description="the rubric's name in judge_agreement")
    batches: list[str] = Field(default_factory=list, description="batches to re-score (empty: every single-turn batch)")
    keep_human: bool = Field(True, description="rollouts a human reviewed keep the human's score")
    created_by: str = Field("dagster", description="who asked for it (recorded with the version)")


@asset(deps=[trajectories, reviews, step_scores, rollouts, tasks], group_name="trust", kinds={"delta"}, pool="gpu",
       metadata=table_definition_metadata("reward_versions"))
def reward_versions(context: AssetExecutionContext, config: RescoreConfig, lakehouse: LakehouseResource, policy: PolicyResource,
                    review: ReviewResource, trainer: TrainerResource) -> MaterializeResult:
    """Re-score the stored trajectories with new weights, a new manager or rubric, or a new step scorer
    into a new reward version, and show its diff against the active version (reward deltas, rank
    changes, advantage sign flips; the plot draws both rewards per rollout). Training keeps the active
    version until `tentalis rescore --activate VERSION`."""
    lake = lakehouse.lakehouse()
    weights = parse_weight_overrides(config.weights, source="reward_versions config 'weights'")
    spec = RescoreSpec(version=config.version, weights=weights, manager=config.manager,
                       step_scorer=config.step_scorer, rubric=config.rubric or None, rubric_name=config.rubric_name,
                       judge_model=review.judge_model, keep_human=config.keep_human)
    models = lakehouse.paths().models
    judge = review.step_judge(lakehouse.paths(), spec.step_scorer) if spec.step_scorer != "stored" else None
    manager = review.llm_manager(models, rubric=spec.rubric) if spec.manager == "llm" else None
    settings = trainer.trajectory_settings(policy.max_new_tokens)
    res = rescore(lake, spec, batches=config.batches or None, judge=judge, llm_manager=manager,
                  scale_rewards=settings["scale_rewards"], dynamic_sampling=settings["dynamic_sampling"], created_by=config.created_by)
    context.log.info(f"reward version {spec.version}: {res.metadata['changed']} of {res.rows} rewards changed, "
                     f"{res.metadata['sign_flips']} advantage sign flips against {res.metadata['base_version']}")
    meta = stage_metadata(res, "reward_versions", lake)
    meta["plot"] = MetadataValue.md(rescore_inline_markdown(read_version(lake, spec.version), res.metadata["base_version"], spec.version))
    return MaterializeResult(metadata=meta)


class AgreementConfig(Config):
    """How agreement is windowed and when a judge counts as drifting."""

    window: str = Field("batch", description="batch or day (UTC) of the judge's scores")
    threshold: float = Field(0.5, description="a score at or above it is a pass")
    min_n: int = Field(5, description="windows with fewer paired rollouts are not judged")
    min_pass_agreement: float = Field(0.7, description="the latest window must agree on pass/fail at least this often")
    max_drop: float = Field(0.2, description="largest allowed fall of pass/fail agreement from the window before")


@asset(deps=[reviews, human_reviews, reward_versions], group_name="trust", kinds={"delta"},
       metadata=table_definition_metadata("judge_agreement"),
       check_specs=[AssetCheckSpec("judge_tracks_managers", asset="judge_agreement",
                                   description="No judge drifts from its human managers: the latest window's pass/fail agreement is above "
                                               "the floor and did not fall by more than the allowed drop.")])
def judge_agreement(config: AgreementConfig, lakehouse: LakehouseResource) -> MaterializeResult:
    """Per judge (llm manager, verifier, a re-score's manager) and rubric, per batch or day and overall:
    mean absolute difference, Spearman correlation and pass/fail agreement with the human managers'
    scores of the same rollouts (imported human reviews, live reviews), with the pass/fail agreement
    plotted per window."""
    lake = lakehouse.lakehouse()
    drift = DriftSettings(min_n=config.min_n, min_pass_agreement=config.min_pass_agreement, max_drop=config.max_drop)
    res, outcomes, rows = build_judge_agreement(lake, window=config.window, threshold=config.threshold, drift=drift)
    meta = stage_metadata(res, "judge_agreement", lake)
    meta["plot"] = MetadataValue.md(agreement_inline_markdown(rows))
    drifting = [o for o in outcomes if o.drifting]
    check = AssetCheckResult(
        check_name="judge_tracks_managers",
        passed=not drifting,
        severity=AssetCheckSeverity.WARN,
        description=("; ".join(f"{o.judge}/{o.rubric}: {' and '.join(o.reasons)}" for o in drifting) if drifting else
                     f"{len(outcomes)} judge(s) with windows of at least {config.min_n} paired rollouts; none drifts"),
        metadata={"judged": len(outcomes), "drifting": ", ".join(f"{o.judge}/{o.rubric}" for o in drifting) or "none",
                  "min_pass_agreement": MetadataValue.float(config.min_pass_agreement), "max_drop": MetadataValue.float(config.max_drop)},
    )
    return MaterializeResult(metadata=meta, check_results=[check])
