"""Jobs: per-batch rollouts, training, and one full learning cycle for the CLI and CI."""


from dagster import (
    AssetMaterialization,
    AssetSelection,
    Config,
    MetadataValue,
    OpExecutionContext,
    define_asset_job,
    job,
    op,
)

from assets.batch_assets import reviews, rollouts, stage_metadata, step_scores, tasks, trajectories
from assets.benchmark_assets import benchmark_results, checkpoint_ids
from assets.partitions import task_batches
from assets.training_assets import checkpoints
from tentalis_pipelines import pipeline
from tentalis_pipelines.resources import (
    BenchmarkResource,
    LakehouseResource,
    PolicyResource,
    ReviewResource,
    TrainerResource,
)
from tentalis_pipelines.tasks.batches import next_generator_seed, register_generated_batch
from tentalis_pipelines.training import serving

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
    description="One checkpoint on one benchmark; on the gate benchmark the promotion gate decides.",
)


class CycleConfig(Config):
    """A seeded batch of arithmetic word problems. ``seed`` defaults to the next unused one."""

    num_tasks: int = 16
    seed: int | None = None
    levels: list[int] = [1, 2]
    train: bool = True


@op
def register_batch(context: OpExecutionContext, config: CycleConfig, lakehouse: LakehouseResource) -> str:
    paths = lakehouse.paths()
    seed = config.seed if config.seed is not None else next_generator_seed(paths.batches)
    batch_id = register_generated_batch(paths.batches, seed=seed, num_tasks=config.num_tasks, levels=tuple(config.levels))
    context.instance.add_dynamic_partitions(task_batches.name, [batch_id])
    context.log.info(f"registered task batch {batch_id}")
    return batch_id


@op(pool="gpu")  # loads a model: one model step at a time, with the assets' steps
def process_batch(
    context: OpExecutionContext, batch_id: str, lakehouse: LakehouseResource, policy: PolicyResource,
    review: ReviewResource, trainer: TrainerResource,
) -> str:
    """The same stage functions the per-batch assets call, reported as materializations of those assets."""
    lake, paths = lakehouse.lakehouse(), lakehouse.paths()
    stages = [
        ("tasks", lambda: pipeline.build_tasks(lake, paths, batch_id, policy.settings())),
        ("rollouts", lambda: pipeline.build_rollouts(lake, paths, batch_id, policy.settings())),
        ("step_scores", lambda: pipeline.build_step_scores(
            lake, batch_id, scorer=review.step_scorer, judge=review.judge(paths.models) if review.step_scorer == "judge" else None)),
        ("reviews", lambda: pipeline.build_reviews(
            lake, batch_id, review.manager, llm_manager=review.llm_manager(paths.models) if review.manager == "llm" else None)),
        ("trajectories", lambda: pipeline.build_trajectories(lake, batch_id, **trainer.trajectory_settings(policy.max_new_tokens))),
    ]
    for name, run in stages:
        res = run()
        context.log_event(AssetMaterialization(asset_key=name, partition=batch_id, metadata=stage_metadata(res, name, lake)))
    return batch_id


@op(pool="gpu")  # loads a model: one model step at a time, with the assets' steps
def train_policy(
    context: OpExecutionContext, config: CycleConfig, batch_id: str, lakehouse: LakehouseResource,
    policy: PolicyResource, trainer: TrainerResource,
) -> str | None:
    if not config.train:
        context.log.info("training skipped (train: false)")
        return None
    res = pipeline.train_checkpoint(
        lakehouse.lakehouse(), lakehouse.paths(), policy.settings(), trainer.config(), promote=trainer.promotion == "always",
        on_step=lambda rec: context.log.info(f"update {rec['step']}: loss={rec['loss']:.4f} kl={rec['kl']:.5f}"),
    )
    context.log_event(AssetMaterialization(asset_key="checkpoints", metadata=stage_metadata(res, "checkpoints", lakehouse.lakehouse())))
    return str(res.metadata["checkpoint_id"])


@op(pool="gpu")  # loads a model: one model step at a time, with the assets' steps
def gate_checkpoint(
    context: OpExecutionContext, checkpoint_id: str | None, lakehouse: LakehouseResource, policy: PolicyResource,
    trainer: TrainerResource, bench: BenchmarkResource,
) -> None:
    """Benchmark the incumbent (if not yet) and the new checkpoint on the gate benchmark; promote on pass."""
    if checkpoint_id is None or trainer.promotion != "gate":
        return
    lake, paths = lakehouse.lakehouse(), lakehouse.paths()
    incumbent = pipeline.incumbent_for(lake, checkpoint_id)
    context.instance.add_dynamic_partitions(checkpoint_ids.name, [c for c in (incumbent, checkpoint_id)
                                                                  if not context.instance.has_dynamic_partition(checkpoint_ids.name, c)])
    results = {}
    for ref in (incumbent, checkpoint_id):
        if ref != checkpoint_id and pipeline.item_correctness(lake, ref, bench.gate_benchmark):
            continue
        results[ref], _ = pipeline.benchmark_checkpoint(lake, paths, policy.settings(), ref, bench.gate_benchmark, limit=bench.limit,
                                                        seed=bench.seed, max_new_tokens=bench.max_new_tokens)
    _, decision = pipeline.decide_promotion(lake, checkpoint_id, bench.gate_benchmark, margin=bench.gate_margin)
    history = pipeline.benchmark_history(lake, bench.gate_benchmark)
    for ref, res in results.items():
        meta = stage_metadata(res, "benchmark_results")
        if ref == checkpoint_id:
            meta.update({"promotion_gate": MetadataValue.text(decision.reason), "promoted": MetadataValue.bool(decision.promote),
                         "serving": MetadataValue.text(serving.serving_checkpoint(lake)),
                         "accuracy_per_checkpoint": MetadataValue.md(history["history"]), "plot": MetadataValue.md(history["plot"])})
        context.log_event(AssetMaterialization(asset_key="benchmark_results", partition=f"{bench.gate_benchmark}|{ref}", metadata=meta))
    context.log.info(f"promotion gate for {checkpoint_id}: {decision.reason}")


@job(description="One full learning cycle: a fresh seeded task batch, its rollouts, scores, reviews and trajectories, training, and the promotion gate.")
def learning_cycle_job():
    batch_id = process_batch(register_batch())
    gate_checkpoint(train_policy(batch_id))
