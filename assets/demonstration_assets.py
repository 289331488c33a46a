"""Demonstrations (verified oracle solutions of a batch's tasks) and the warm-start checkpoint trained on them."""

from dagster import (
    AssetCheckResult,
    AssetCheckSeverity,
    AssetCheckSpec,
    AssetExecutionContext,
    Config,
    MaterializeResult,
    asset,
)

from assets.batch_assets import stage_metadata, tasks
from assets.partitions import checkpoint_ids, task_batches
from assets.resources import LakehouseResource, PolicyResource, TrainerResource
from assets.table_metadata import table_definition_metadata
from tentalis_pipelines.demonstrations import (
    check_demonstrations,
    oracle_demonstrations,
    write_demonstrations,
)
from tentalis_pipelines.stages.common import StageResult
from tentalis_pipelines.stages.warm_start import check_warm_start, train_warm_start
from tentalis_pipelines.training.warm_start import WarmStartConfig


@asset(partitions_def=task_batches, deps=[tasks], group_name="learning_loop", kinds={"delta"},
       metadata=table_definition_metadata("demonstrations"),
       check_specs=[AssetCheckSpec("no_held_out_demonstrations", asset="demonstrations", blocking=True,
                                   description="No demonstration is of a held-out task (its id, split or content), each names a "
                                               "task of the batch, and each verified one holds the conversation it was verified in.")])
def demonstrations(context: AssetExecutionContext, lakehouse: LakehouseResource) -> MaterializeResult:
    """The oracle's demonstration of every task of an environment batch (terminal, BFCL, mini-SWE): the
    task's scripted solution in the policy's action format, replayed in the real environment; only those
    that pass land (source `oracle`). A person's (`tentalis demos import`) and a stronger model's
    (`tentalis demos model`) land in the same table."""
    lake = lakehouse.lakehouse()
    rows, summary = oracle_demonstrations(lake, context.partition_key)
    n = write_demonstrations(lake, rows, sources={(context.partition_key, "oracle")})
    passed, description, meta = check_demonstrations(lake, context.partition_key)
    check = AssetCheckResult(check_name="no_held_out_demonstrations", passed=passed, description=description, metadata=meta,
                             severity=AssetCheckSeverity.ERROR)
    return MaterializeResult(metadata=stage_metadata(StageResult(n, summary), "demonstrations", lake), check_results=[check])


class WarmStartRunConfig(Config):
    """Which demonstrations and how long (``training/warm_start.py``: WarmStartConfig)."""

    batches: list[str] = []  # the demonstrations' batches; empty: every verified demonstration
    epochs: int = 3
    learning_rate: float = 1e-4
    per_step_rows: int = 8
    seed: int = 0  # shuffling of the demonstrations (the LoRA's initialisation: the trainer resource's seed)


@asset(deps=[demonstrations], group_name="learning_loop", kinds={"delta", "pytorch"}, pool="gpu",
       metadata=table_definition_metadata("checkpoints"),
       check_specs=[AssetCheckSpec("warm_start_lineage", asset="warm_start",
                                   description="The warm-start checkpoint names its demonstrations (config and one lineage row "
                                               "each), and its training lowered their tokens' negative log-likelihood.")])
def warm_start(context: AssetExecutionContext, config: WarmStartRunConfig, lakehouse: LakehouseResource, policy: PolicyResource,
               trainer: TrainerResource) -> MaterializeResult:
    """A LoRA checkpoint trained with a supervised loss on the demonstrated assistant turns (observations,
    system and user tokens masked), continuing the serving policy; recorded in `checkpoints` (algorithm
    `sft_warm_start`, trained_on = the demonstrations' batches) and registered as a `checkpoint_ids`
    partition. Not promoted here: its benchmarks and the promotion gate decide, as for an RL checkpoint."""
    lake = lakehouse.lakehouse()
    warm = WarmStartConfig(epochs=config.epochs, learning_rate=config.learning_rate, per_step_rows=config.per_step_rows,
                          seed=config.seed)
    res = train_warm_start(lake, lakehouse.paths(), policy.settings(), trainer.config(), warm, batches=config.batches or None,
                           on_step=lambda rec: context.log.info(f"step {rec['step']}: loss={rec['loss']:.4f}"))
    cid = str(res.metadata["checkpoint_id"])
    new = [c for c in ("base", cid) if not context.instance.has_dynamic_partition(checkpoint_ids.name, c)]
    if new:
        context.instance.add_dynamic_partitions(checkpoint_ids.name, new)
    passed, description, meta = check_warm_start(lake, cid)
    check = AssetCheckResult(check_name="warm_start_lineage", passed=passed, description=description,
                             metadata={k: v for k, v in meta.items() if v is not None}, severity=AssetCheckSeverity.ERROR)
    return MaterializeResult(metadata=stage_metadata(res, "checkpoints", lake), check_results=[check])
