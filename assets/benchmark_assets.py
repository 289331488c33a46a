"""Benchmarks as downstream assets of checkpoints, the learning curve, and the judge on ProcessBench."""

from dagster import (
    AssetExecutionContext,
    Config,
    MaterializeResult,
    MetadataValue,
    MultiPartitionsDefinition,
    StaticPartitionsDefinition,
    asset,
)

from assets.batch_assets import reviews, stage_metadata, tasks, teacher_logprobs, trajectories
from assets.partitions import checkpoint_ids
from assets.resources import BenchmarkResource, LakehouseResource, PolicyResource, ReviewResource
from assets.table_metadata import table_definition_metadata
from assets.training_assets import checkpoints
from tentalis_pipelines import promotion
from tentalis_pipelines.evaluation.benchmarks import BENCHMARKS
from tentalis_pipelines.evaluation.plots import accuracy_inline_markdown, level_success_markdown
from tentalis_pipelines.stages.evaluation import benchmark_checkpoint

# One partition per checkpoint ("base" for the base model) x benchmark.
benchmark_partitions = MultiPartitionsDefinition(
    {"checkpoint": checkpoint_ids, "benchmark": StaticPartitionsDefinition(list(BENCHMARKS))}
)


def accuracy_plots(history: dict, benchmark: str) -> dict:
    """The accuracy plot twice: a small SVG that the asset page shows as it is, and the full PNG (behind a click)."""
    return {"plot": MetadataValue.md(accuracy_inline_markdown(history["results"], f"{benchmark}: accuracy per checkpoint")),
            "plot_png": MetadataValue.md(history["plot"])}


@asset(
    partitions_def=benchmark_partitions,
    deps=[checkpoints],
    group_name="evaluation",
    kinds={"delta", "pytorch"},
    pool="gpu",
    metadata=table_definition_metadata("benchmark_results"),
)
def benchmark_results(
    context: AssetExecutionContext, lakehouse: LakehouseResource, policy: PolicyResource, benchmark: BenchmarkResource
) -> MaterializeResult:
    """A checkpoint's accuracy on one benchmark (strict, lenient, format rate, 95% bootstrap interval),
    with one `benchmark_items` row per item. The promotion gate reads these (the `serving` asset)."""
    keys = context.partition_key.keys_by_dimension
    checkpoint_id, benchmark_name = keys["checkpoint"], keys["benchmark"]
    lake, paths = lakehouse.lakehouse(), lakehouse.paths()
    res, _ = benchmark_checkpoint(lake, paths, policy.settings(), checkpoint_id, benchmark_name, limit=benchmark.limit,
                                  seed=benchmark.seed, max_new_tokens=benchmark.max_new_tokens)
    meta = stage_metadata(res, "benchmark_results", lake)
    meta["dagster/row_count"] = MetadataValue.int(1)  # the partition's one row; `n` counts the benchmark items
    history = promotion.benchmark_history(lake, benchmark_name)
    meta["accuracy_per_checkpoint"] = MetadataValue.md(history["history"])
    meta.update(accuracy_plots(history, benchmark_name))
    if res.metadata.get("success_per_level"):  # environment benchmarks: each level's success with its interval
        meta["success_per_level_plot"] = MetadataValue.md(
            level_success_markdown(res.metadata["success_per_level"], f"{benchmark_name}: success per level, {checkpoint_id}"))
    return MaterializeResult(metadata=meta)


@asset(deps=[benchmark_results, checkpoints], group_name="evaluation", kinds={"delta"})
def learning_curve(lakehouse: LakehouseResource, benchmark: BenchmarkResource) -> MaterializeResult:
    """Held-out accuracy (strict and lenient, 95% bootstrap intervals, paired difference against the base
    model) and format rate of every checkpoint on the gate benchmark, base first: the table and the plot
    (inline SVG and full PNG)."""
    lake = lakehouse.lakehouse()
    history = promotion.benchmark_history(lake, benchmark.gate_benchmark)
    return MaterializeResult(metadata={"benchmark": benchmark.gate_benchmark, "dagster/row_count": history["rows"],
                                       "curve": MetadataValue.md(history["history"]), **accuracy_plots(history, benchmark.gate_benchmark)})


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


@asset(deps=[checkpoints, trajectories, reviews, tasks, teacher_logprobs], group_name="evaluation", kinds={"delta"},
       metadata=table_definition_metadata("hint_efficacy"))
def hint_efficacy(lakehouse: LakehouseResource) -> MaterializeResult:
    """Did the hint change behaviour? For each checkpoint that trained on hinted failures: the same task
    family's success before (the policy that failed) and after (the checkpoint's own rollouts), per
    manager and hint kind, with a 95% interval on the difference."""
    from tentalis_pipelines.evaluation.plots import inline_plot_markdown
    from tentalis_pipelines.stages.hint_efficacy import build_hint_efficacy

    lake = lakehouse.lakehouse()
    res = build_hint_efficacy(lake)
    meta = stage_metadata(res, "hint_efficacy", lake)
    rows = [r for r in lake.read("hint_efficacy").to_pylist() if r["delta"] is not None] if res.rows else []
    if rows:
        rows.sort(key=lambda r: (r["computed_at"], r["checkpoint_id"], r["manager"], r["hint_kind"], r["family"]))
        labels = [f"{r['hint_kind']}/{r['family']}" for r in rows]
        meta["plot"] = MetadataValue.md(inline_plot_markdown(
            labels, [("after", "#1f77b4", [r["after_success"] for r in rows]), ("before", "#aaaaaa", [r["before_success"] for r in rows])],
            title="family success after vs before the hinted checkpoint", ylim=(0.0, 1.0)))
    return MaterializeResult(metadata=meta)
