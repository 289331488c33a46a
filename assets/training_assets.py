"""The policy: LoRA checkpoints trained on fresh trajectories."""


from dagster import AssetExecutionContext, MaterializeResult, asset

from assets.batch_assets import guided_rollouts, rollouts, to_materialize_result, trajectories
from assets.grounding_assets import grounding_flags
from assets.partitions import checkpoint_ids
from assets.resources import LakehouseResource, PolicyResource, TrainerResource
from assets.table_metadata import table_definition_metadata
from tentalis_pipelines.stages.training import train_checkpoint


@asset(deps=[trajectories, rollouts, guided_rollouts, grounding_flags], group_name="learning_loop", kinds={"delta", "pytorch"}, pool="gpu",
       metadata=table_definition_metadata("checkpoints"))
def checkpoints(
    context: AssetExecutionContext, lakehouse: LakehouseResource, policy: PolicyResource, trainer: TrainerResource
) -> MaterializeResult:
    """A new LoRA checkpoint trained with GRPO on every fresh trajectory of the serving policy;
    recorded in `checkpoints` with its parent, batches, trajectory ids, config and metrics, and
    registered as a `checkpoint_ids` partition for its benchmarks. The training runs where
    `trainer.launcher` says (in this process, a Dagster Pipes subprocess or a Ray job)."""
    res = train_checkpoint(
        lakehouse.lakehouse(), lakehouse.paths(), policy.settings(), trainer.config(), promote=trainer.promotion == "always",
        on_step=lambda rec: context.log.info(f"update {rec['step']}: loss={rec['loss']:.4f} kl={rec['kl']:.5f}"),
        launcher=trainer.training_launcher(context),
    )
    # The checkpoint's benchmark partitions exist as soon as the checkpoint does (sensors and CI target them).
    new = [c for c in ("base", str(res.metadata["checkpoint_id"])) if not context.instance.has_dynamic_partition(checkpoint_ids.name, c)]
    if new:
        context.instance.add_dynamic_partitions(checkpoint_ids.name, new)
    return to_materialize_result(res, "checkpoints", lakehouse.lakehouse())
