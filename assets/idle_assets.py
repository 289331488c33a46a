"""Idle-window training: a checkpoint trained while the gateway is idle, yielding when a request arrives."""

from dagster import AssetExecutionContext, AssetMaterialization, Config, MaterializeResult, asset

from assets.batch_assets import rollouts, to_materialize_result, trajectories
from assets.partitions import checkpoint_ids
from assets.resources import LakehouseResource, PolicyResource, TrainerResource
from assets.table_metadata import table_definition_metadata
from tentalis_pipelines.activity import activity_path
from tentalis_pipelines.stages.idle_window import run_window


class WindowConfig(Config):
    """``idle_since_ns``: the gateway's activity stamp the sensor saw (unset: read when the run starts);
    the window yields as soon as it changes."""

    idle_since_ns: int | None = None


@asset(deps=[trajectories, rollouts], group_name="learning_loop", kinds={"delta", "pytorch"}, pool="gpu",
       metadata=table_definition_metadata("training_windows"))
def training_windows(
    context: AssetExecutionContext, config: WindowConfig, lakehouse: LakehouseResource, policy: PolicyResource, trainer: TrainerResource
) -> MaterializeResult:
    """One idle window: trains (or resumes) a checkpoint on the serving policy's fresh trajectories
    while the gateway serves no request, saving progress every `trainer.progress_every` micro-steps,
    and yields within a pass when a request arrives. One row of `training_windows` per window; a
    finished window's checkpoint is recorded in `checkpoints` like `train_job`'s."""
    paths, lake = lakehouse.paths(), lakehouse.lakehouse()
    res = run_window(
        lake, paths, policy.settings(), trainer.config(), promote=trainer.promotion == "always",
        activity_file=activity_path(paths.home), idle_since_ns=config.idle_since_ns, hours=trainer.idle_hours,
        progress_every=trainer.progress_every, run_id=context.run_id,
        background=True,  # this step's process exists to train the window: users' requests come first
        on_step=lambda rec: context.log.info(f"update {rec['step']}: loss={rec['loss']:.4f} kl={rec['kl']:.5f}"),
    )
    context.log.info(f"window {res.metadata['window_id']}: {res.metadata['outcome']} ({res.metadata.get('reason', '')})")
    checkpoint_id = res.metadata.get("checkpoint_id")
    if checkpoint_id:
        # The checkpoint's benchmark partitions exist as soon as it does, and the checkpoints asset shows it.
        new = [c for c in ("base", checkpoint_id) if not context.instance.has_dynamic_partition(checkpoint_ids.name, c)]
        if new:
            context.instance.add_dynamic_partitions(checkpoint_ids.name, new)
        context.log_event(AssetMaterialization("checkpoints", description=f"trained in idle window {res.metadata['window_id']}",
                                               metadata={"checkpoint_id": checkpoint_id}))
    return to_materialize_result(res, "training_windows", lake)
