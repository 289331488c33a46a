"""The serving pointer as an asset, guarded by the `promotion_gate` check.

The gate decides inside the asset, before the pointer moves: a pass moves it, a rejection leaves it
and is reported as a failed check of severity WARN (the run succeeds: rejecting a checkpoint is the
gate doing its job, not an error). Dagster fails the step on a failed *blocking* ERROR check, which is
why the check is not declared blocking: nothing downstream could be protected by it anyway, since the
pointer only moves on a pass.
"""

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

from assets.benchmark_assets import benchmark_results
from assets.resources import BenchmarkResource, LakehouseResource
from assets.table_metadata import table_definition_metadata, table_uri_metadata
from assets.training_assets import checkpoints
from tentalis_pipelines import promotion
from tentalis_pipelines.training import serving as serving_pointer


class GateConfig(Config):
    """Which checkpoint the gate decides on. Empty: the newest checkpoint without a gate decision."""

    checkpoint_id: str | None = None


@asset(
    deps=[benchmark_results, checkpoints],
    group_name="serving",
    kinds={"delta"},
    metadata=table_definition_metadata("serving"),
    check_specs=[AssetCheckSpec(
        "promotion_gate", asset="serving",
        description="Paired comparison of the candidate with the incumbent on the gate benchmark's items: the pointer "
                    "moves to the candidate unless it is worse beyond the 95% interval. A rejection fails this check "
                    "(with its numbers) and leaves the pointer where it was.")],
)
def serving(context: AssetExecutionContext, config: GateConfig, lakehouse: LakehouseResource,
            benchmark: BenchmarkResource) -> MaterializeResult:
    """What serves the next rollouts: the `serving` table's newest row. The promotion gate decides on a
    candidate checkpoint from `benchmark_results` and, on a pass, moves the pointer; every decision is a
    row of `gate_decisions`."""
    lake = lakehouse.lakehouse()
    gate = benchmark.gate_benchmark
    candidate = config.checkpoint_id
    if candidate is None:
        pending = promotion.undecided_checkpoints(lake, gate)
        candidate = pending[-1] if pending else None
    meta: dict = {"gate_benchmark": gate, **table_uri_metadata(lake, "serving")}
    if candidate is None:
        current = serving_pointer.serving_checkpoint(lake)
        meta.update({"serving": current, "decision": "no checkpoint awaits a decision"})
        check = AssetCheckResult(check_name="promotion_gate", passed=True, metadata={"decision": "nothing to decide", "serving": current},
                                 description=f"no checkpoint awaits a gate decision; {current} serves")
        return MaterializeResult(metadata=meta, check_results=[check])
    incumbent, decision = promotion.decide_promotion(lake, candidate, gate, margin=benchmark.gate_margin)
    current = serving_pointer.serving_checkpoint(lake)
    context.log.info(f"promotion gate for {candidate} vs {incumbent}: {decision.reason}")
    numbers = {k: MetadataValue.float(float(v)) for k, v in decision.as_dict().items() if isinstance(v, float)}
    meta.update({"candidate": candidate, "incumbent": incumbent, "promoted": MetadataValue.bool(decision.promote),
                 "serving": current, "decision": decision.reason,
                 "serving_history": MetadataValue.md(_history_table(lake)), "dagster/row_count": len(serving_pointer.serving_history(lake))})
    check = AssetCheckResult(
        check_name="promotion_gate",
        passed=decision.promote,
        severity=AssetCheckSeverity.WARN,
        description=decision.reason,
        metadata={"candidate": candidate, "incumbent": incumbent, "serving": current, "n_paired": decision.n_paired,
                  "margin": MetadataValue.float(float(benchmark.gate_margin)), **numbers},
    )
    return MaterializeResult(metadata=meta, check_results=[check])


def _history_table(lake) -> str:
    from tentalis_pipelines.stages.common import markdown_table

    rows = serving_pointer.serving_history(lake)[-10:]
    return markdown_table([{k: r[k] for k in ("seq", "from_checkpoint", "to_checkpoint", "action", "actor", "reason")} for r in rows[::-1]])
