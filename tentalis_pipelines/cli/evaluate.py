"""`tentalis benchmark` and `export-curve`: held-out accuracy of a checkpoint, and a run's curve as CSV rows."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import typer
from rich.table import Table

from tentalis_pipelines.cli.common import (
    MAX_COUNT,
    MAX_SEED,
    MAX_TOKENS,
    HomeOpt,
    app,
    console,
    err,
    home_paths,
)


@app.command()
def benchmark(
    checkpoint: str = typer.Option("promoted", help="'base', 'promoted' or a checkpoint id."),
    tasks: str = typer.Option("arithmetic", "--tasks", "--benchmark", help="arithmetic | gsm8k | math500 | humaneval | terminal (the agent gym's held-out "
                              "split, one greedy episode per task; terminal-l0 ... terminal-l3: one level's) | bfcl (BFCL's multi_turn_base "
                              "through its checker) | swe (the mini-SWE held-out bugs, one greedy episode each) | an installed environment family's "
                              "name (its held-out split, docs/families.md) | path/to/tasks.jsonl"),
    limit: int | None = typer.Option(None, min=1, max=MAX_COUNT, help="Items to evaluate (a fixed seeded subset)."),
    seed: int = typer.Option(0, min=0, max=MAX_SEED, help="Seed of the subset."),
    format: str = typer.Option("table", "--format", "-f", help="table | json"),
    record: bool = typer.Option(True, help="Write benchmark_results and benchmark_items."),
    max_new_tokens: int | None = typer.Option(None, min=1, max=MAX_TOKENS, help="Answer length limit (default per benchmark)."),
    model: str | None = typer.Option(None, help="Base model (default: $TENTALIS_MODEL or embedded)."),
    home: str | None = HomeOpt,
):
    """Evaluate a checkpoint on a benchmark or any JSONL task file and print the result."""
    paths = home_paths(home)
    from tentalis_pipelines.evaluation.benchmarks import BenchmarkDataMissing
    from tentalis_pipelines.lakehouse import Lakehouse
    from tentalis_pipelines.policy import PolicySettings
    from tentalis_pipelines.stages.evaluation import benchmark_checkpoint

    if format not in ("table", "json"):
        err.print(f"[red]--format must be table or json, not {format!r}[/]")
        raise typer.Exit(2)
    policy = PolicySettings(model=model or os.environ.get("TENTALIS_MODEL", "embedded"))
    from tentalis_pipelines.tasks.terminal_file import is_terminal_task_file

    if is_terminal_task_file(tasks):  # bad lines listed with their fix; the good ones are evaluated
        from tentalis_pipelines.cli.cycle import report_task_file

        report_task_file(tasks)
    try:
        with console.status(f"evaluating {checkpoint} on {tasks}..."):
            res, s = benchmark_checkpoint(Lakehouse(paths.lakehouse), paths, policy, checkpoint, tasks, limit=limit, seed=seed, record=record,
                                          max_new_tokens=max_new_tokens)
    except (BenchmarkDataMissing, ValueError) as exc:
        err.print(f"[red]error:[/] {exc}")
        raise typer.Exit(2) from None
    out = {"checkpoint": checkpoint, "benchmark": s.benchmark, "n": s.n, "accuracy": s.accuracy,
           "lenient_accuracy": s.lenient_accuracy, "format_rate": s.format_rate, "ci_low": s.ci_low,
           "ci_high": s.ci_high, "seconds": round(s.seconds, 2)}
    per_level = res.metadata.get("success_per_level")
    if format == "json" and per_level:
        out["success_per_level"] = per_level
    if format == "json":
        sys.stdout.write(json.dumps(out) + "\n")
        return
    t = Table(title=f"{s.benchmark} — {checkpoint}")
    for k in out:
        t.add_column(k)
    t.add_row(*[f"{v:.3f}" if isinstance(v, float) else str(v) for v in out.values()])
    console.print(t)
    for level, v in (per_level or {}).items():
        console.print(f"  level {level}: {v['success']:.3f} of {v['n']} (95% CI {v['ci_low']:.3f}-{v['ci_high']:.3f})")


@app.command("export-curve")
def export_curve(
    seed: int = typer.Option(..., min=0, max=MAX_SEED, help="The run's seed (a column of the CSV)."),
    label: str = typer.Option(..., help="A name for the run, e.g. the recipe it used."),
    out: Path = typer.Option(..., help="The CSV to append to (created with its header when new)."),
    commit: str | None = typer.Option(None, help="Only for checkpoints whose lineage records no code commit."),
    benchmark_name: str = typer.Option("arithmetic", "--benchmark", help="The held-out benchmark of the curve."),
    home: str | None = HomeOpt,
):
    """Append this home's held-out learning curve (one row per evaluated checkpoint, the base first) to a CSV."""
    from tentalis_pipelines.evaluation.learning_runs import append_csv, rows_for

    paths = home_paths(home)
    try:
        rows = rows_for(paths.home, seed, label, commit, benchmark=benchmark_name)
    except ValueError as exc:
        err.print(f"[red]error:[/] {exc}")
        raise typer.Exit(2) from None
    append_csv(rows, out)
    for r in rows:
        console.print(r["checkpoint"], r["minutes"], r["accuracy"], r["vs_base"], r["vs_base_ci_low"], r["vs_base_ci_high"], r["promoted"])
