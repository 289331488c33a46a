"""`tentalis sql`, `maintain`, `import-reviews`: the lakehouse tables."""

from __future__ import annotations

import csv
import io
import json
import sys
from pathlib import Path

import typer
from rich.table import Table

from tentalis_pipelines.cli.common import (
    MAX_HOURS,
    HomeOpt,
    add_column,
    app,
    console,
    csv_safe,
    err,
    home_paths,
    print_table,
)


@app.command()
def sql(
    query: str = typer.Argument(..., help="DuckDB SQL over the tables (tasks, rollouts, step_scores, reviews, trajectories, checkpoints, quarantine)."),
    format: str = typer.Option("table", "--format", "-f", help="table | json | csv"),
    home: str | None = HomeOpt,
):
    """Query the lakehouse with DuckDB SQL."""
    paths = home_paths(home)
    import duckdb

    from tentalis_pipelines.lakehouse import Lakehouse

    if format not in ("table", "json", "csv"):
        err.print(f"[red]--format must be table, json or csv, not {format!r}[/]")
        raise typer.Exit(2)
    try:
        result = Lakehouse(paths.lakehouse).sql(query)
    except duckdb.Error as exc:
        err.print(f"[red]SQL error:[/] {exc}")
        raise typer.Exit(1) from None
    rows = result.to_pylist()
    if format == "json":
        sys.stdout.write(json.dumps(rows, default=str) + "\n")
    elif format == "csv":
        buf = io.StringIO()
        w = csv.DictWriter(buf, fieldnames=result.column_names, lineterminator="\n")  # Unix lines, for shell pipelines
        w.writeheader()
        w.writerows({k: csv_safe(v) for k, v in r.items()} for r in rows)
        sys.stdout.write(buf.getvalue())
    else:
        t = Table()
        for c in result.column_names:
            add_column(t, c)
        for r in rows:
            t.add_row(*[str(v) for v in r.values()])
        print_table(t)


@app.command()
def maintain(
    table: list[str] = typer.Option([], "--table", "-t", help="Table to maintain (repeatable; default: every table)."),
    compact: bool = typer.Option(True, help="Compact small files (rows unchanged)."),
    zorder: bool = typer.Option(False, help="Also Z-order the unpartitioned tables by their key columns (rewrites them)."),
    vacuum: bool = typer.Option(True, help="Delete files no version within the retention needs."),
    retention_hours: int | None = typer.Option(
        None, min=0, max=MAX_HOURS, help="Vacuum retention (default: $TENTALIS_VACUUM_RETENTION_HOURS or 168). Time travel past it is lost."),
    allow_unsafe_retention: bool = typer.Option(
        False, help="Allow a retention below Delta's safe minimum (only when nothing else reads or writes the tables)."),
    checkpoint: bool = typer.Option(True, help="Write a log checkpoint so loading a table replays less."),
    format: str = typer.Option("table", "--format", "-f", help="table | json"),
    home: str | None = HomeOpt,
):
    """Compact, vacuum and checkpoint the Delta tables (what the weekly maintain_lakehouse_job does)."""
    paths = home_paths(home)
    from tentalis_pipelines.lakehouse import Lakehouse, LakehouseError, human_bytes

    if format not in ("table", "json"):
        err.print(f"[red]--format must be table or json, not {format!r}[/]")
        raise typer.Exit(2)
    try:
        reports = Lakehouse(paths.lakehouse).maintain_all(
            table or None, compact=compact, zorder=zorder, vacuum=vacuum, checkpoint=checkpoint,
            retention_hours=retention_hours, allow_unsafe_retention=allow_unsafe_retention,
        )
    except (LakehouseError, ValueError) as exc:
        err.print(f"[red]error:[/] {exc}")
        raise typer.Exit(2) from None
    if format == "json":
        sys.stdout.write(json.dumps(reports) + "\n")
        return
    t = Table(title=f"maintenance of {paths.lakehouse}")
    for col in ("table", "files", "rows", "bytes", "vacuumed", "checkpoint", "seconds"):
        t.add_column(col, justify="left" if col == "table" else "right")
    for r in reports:
        t.add_row(r["table"], f"{r['files_before']} → {r['files_after']}", f"{r['rows_after']}",
                  f"{human_bytes(r['bytes_before'])} → {human_bytes(r['bytes_after'])}", str(r["vacuumed_files"]),
                  f"v{r['checkpoint_version']}" if r["checkpoint_version"] is not None else "-", f"{r['seconds']:.2f}")
    console.print(t if reports else "no tables yet")


@app.command("import-reviews")
def import_reviews(
    path: Path = typer.Argument(..., help="JSONL or CSV with rollout_id, score (0-1), critique, hint[, reviewer]."),
    home: str | None = HomeOpt,
):
    """Import human reviews keyed by rollout id (unknown ids are quarantined; re-importing changes nothing).
    Re-materialise the batch's `reviews` with manager=human to use them."""
    paths = home_paths(home)
    from tentalis_pipelines.lakehouse import Lakehouse
    from tentalis_pipelines.stages.human_reviews import import_human_reviews

    try:
        out = import_human_reviews(Lakehouse(paths.lakehouse), path)
    except FileNotFoundError as exc:
        err.print(f"[red]error:[/] {exc}")
        raise typer.Exit(2) from None
    console.print(f"applied {out['applied']} review(s); quarantined {out['quarantined']} line(s)")
