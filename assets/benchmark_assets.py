"""Benchmarks as downstream assets of checkpoints, and the promotion gate."""

from dagster import (
    AssetCheckResult,
    AssetCheckSeverity,
    AssetCheckSpec,
    AssetExecutionContext,
    AssetMaterialization,
    Config,
    DynamicPartitionsDefinition,
    MaterializeResult,
    MetadataValue,
    MultiPartitionsDefinition,
    StaticPartitionsDefinition,
    asset,
)

from assets.batch_assets import stage_metadata
from assets.table_metadata import table_definition_metadata
from assets.training_assets import checkpoints
from tentalis_pipelines import pipeline
from tentalis_pipelines.evaluation.benchmarks import BENCHMARKS
from tentalis_pipelines.resources import BenchmarkResource, LakehouseResource, PolicyResource, ReviewResource
from tentalis_pipelines.training import serving

# One partition per checkpoint ("base" for the base model) x benchmark.
checkpoint_ids = DynamicPartitionsDefinition(name="checkpoint_ids")
benchmark_partitions = MultiPartitionsDefinition(
    {"checkpoint": checkpoint_ids, "benchmark": StaticPartitionsDefinition(list(BENCHMARKS))}
)


@asset(
    partitions_def=benchmark_partitions,
    deps=[checkpoints],
    group_name="evaluation",
    kinds={"delta", "pytorch"},
    pool="gpu",
    metadata=table_definition_metadata("benchmark_results"),
    check_specs=[AssetCheckSpec("promotion_gate", asset="benchmark_results", blocking=True,
                                description="Paired comparison with the incumbent; promotes the checkpoint unless it is worse beyond the 95% interval.")],
)
def benchmark_results(
    context: AssetExecutionContext, lakehouse: LakehouseResource, policy: PolicyResource, bench: BenchmarkResource
) -> MaterializeResult:
    """A checkpoint's accuracy on one benchmark (strict, lenient, format rate, 95% bootstrap interval),
    with one `benchmark_items` row per item. On the gate benchmark, the promotion gate decides."""
    keys = context.partition_key.keys_by_dimension
    checkpoint_id, benchmark = keys["checkpoint"], keys["benchmark"]
    lake, paths = lakehouse.lakehouse(), lakehouse.paths()
    res, _ = pipeline.benchmark_checkpoint(lake, paths, policy.settings(), checkpoint_id, benchmark, limit=bench.limit, seed=bench.seed,
            max_new_tokens=bench.max_new_tokens)
    meta = stage_metadata(res, "benchmark_results", lakehouse.lakehouse())
    history = pipeline.benchmark_history(lake, benchmark)
    meta["accuracy_per_checkpoint"] = MetadataValue.md(history["history"])
    meta["plot"] = MetadataValue.md(history["plot"])
    if checkpoint_id == "base" or benchmark != bench.gate_benchmark:
        check = AssetCheckResult(check_name="promotion_gate", passed=True,
                                 metadata={"decision": "not gated (base model or not the gate benchmark)"})
        return MaterializeResult(metadata=meta, check_results=[check])
    incumbent = pipeline.incumbent_for(lake, checkpoint_id)
    if not pipeline.item_correctness(lake, incumbent, benchmark):
        inc_res, _ = pipeline.benchmark_checkpoint(lake, paths, policy.settings(), incumbent, benchmark, limit=bench.limit, seed=bench.seed,
            max_new_tokens=bench.max_new_tokens)
        context.log_event(AssetMaterialization(asset_key="benchmark_results", partition=f"{benchmark}|{incumbent}",
                                               metadata=stage_metadata(inc_res, "benchmark_results")))
    incumbent, decision = pipeline.decide_promotion(lake, checkpoint_id, benchmark, margin=bench.gate_margin)
    check = AssetCheckResult(
        check_name="promotion_gate",
        passed=decision.promote,
        severity=AssetCheckSeverity.ERROR,
        metadata={"incumbent": incumbent, "reason": decision.reason, "serving": serving.serving_checkpoint(lake),
                  **{k: MetadataValue.float(float(v)) for k, v in decision.as_dict().items() if isinstance(v, float)},
                  "n_paired": decision.n_paired},
    )
    return MaterializeResult(metadata=meta, check_results=[check])


@asset(deps=[benchmark_results], group_name="evaluation", kinds={"delta"})
def learning_curve(lakehouse: LakehouseResource, bench: BenchmarkResource) -> MaterializeResult:
    """Held-out accuracy (strict and lenient, 95% bootstrap intervals) and format rate of every
    checkpoint on the gate benchmark, base first: the table and a PNG plot."""
    lake = lakehouse.lakehouse()
    history = pipeline.benchmark_history(lake, bench.gate_benchmark)
    n = sum(1 for r in lake.read("benchmark_results").to_pylist() if r["benchmark"] == bench.gate_benchmark)
    return MaterializeResult(metadata={"benchmark": bench.gate_benchmark, "dagster/row_count": n,
                                       "curve": MetadataValue.md(history["history"]), "plot": MetadataValue.md(history["plot"])})


class ProcessBenchConfig(Config):
    """ProcessBench splits to evaluate the judge on, samples per split (seeded subset) and the mode."""

    splits: list[str] = ["gsm8k"]
    limit: int = 100
    seed: int = 0
    mode: str = "first_error"


@asset(group_name="evaluation", kinds={"pytorch"}, pool="gpu")
def prm_evaluation(config: ProcessBenchConfig, lakehouse: LakehouseResource, review: ReviewResource) -> MaterializeResult:
    """How good are the reviews? The judge PRM on ProcessBench (from TENTALIS_DATA_DIR): accuracy on
    erroneous and on correct samples and their harmonic mean (F1), per split, with the judge and votes used."""
    from tentalis_pipelines.evaluation.processbench import (
        evaluate_processbench,
        load_processbench,
        markdown_table,
    )

    judge = review.judge(lakehouse.paths().models)
    splits = {s: load_processbench(s, limit=config.limit, seed=config.seed) for s in config.splits}
    result = evaluate_processbench(splits, judge, mode=config.mode, settings={"limit": config.limit, "seed": config.seed})
    meta = {"judge": review.judge_model, "num_votes": review.num_votes, "mode": config.mode, "results": MetadataValue.md(markdown_table(result))}
    for name, split in result.splits.items():
        if split.metrics.f1 is not None:
            meta[f"{name}_f1"] = MetadataValue.float(float(split.metrics.f1))
    return MaterializeResult(metadata=meta)
