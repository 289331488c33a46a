"""`tentalis contamination`: screen a task file against the benchmarks before it is dropped in the inbox."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer
from rich.table import Table

from tentalis_pipelines.cli.common import HomeOpt, add_column, app, console, err, home_paths, print_table


@app.command()
def contamination(
    file: Path = typer.Argument(..., help="A JSONL task file (GSM8K, MATH or generic rows), or - for one prompt per line on stdin."),
    format: str = typer.Option("table", "--format", "-f", help="table | json"),
    embeddings: bool = typer.Option(True, "--embeddings/--no-embeddings", help="Run the MiniLM tier too (the slowest)."),
    home: str | None = HomeOpt,
):
    """Which lines of FILE are benchmark or held-out items (exact, 13-gram or embedding match), against every
    benchmark whose data is installed (the others are named, with why: `tentalis data fetch` installs them).
    Exits 1 when any line matches, 2 when the index cannot be built (the message names the unusable file)."""
    from tentalis_pipelines import contamination as guard
    from tentalis_pipelines.lakehouse import Lakehouse
    from tentalis_pipelines.tasks.jsonl import TaskRowError, parse_task_record

    if format not in ("table", "json"):
        err.print(f"[red]--format must be table or json, not {format!r}[/]")
        raise typer.Exit(2)
    paths = home_paths(home)
    if str(file) == "-":
        prompts = [(n, line.rstrip("\n")) for n, line in enumerate(sys.stdin, start=1) if line.strip()]
    else:
        if not file.is_file():
            err.print(f"[red]{file} does not exist[/]")
            raise typer.Exit(2)
        prompts = []
        for n, line in enumerate(file.read_text(encoding="utf-8").splitlines(), start=1):
            if not line.strip():
                continue
            try:
                prompts.append((n, parse_task_record(json.loads(line))["prompt"]))
            except (ValueError, TaskRowError) as exc:
                err.print(f"[yellow]{file}:{n}: skipped ({exc})[/]")
    try:
        index = guard.build_index(Lakehouse(paths.lakehouse), cache_dir=guard.default_cache_dir(paths.home))
    except (guard.ContaminationIndexUnavailable, ValueError) as exc:
        err.print(f"[red]{exc}[/]")
        raise typer.Exit(2) from None
    matches = index.match([p for _, p in prompts], use_embeddings=embeddings)
    rows = [{"line": n, **m.as_dict()} for (n, _), m in zip(prompts, matches) if m is not None]
    screen = index.coverage.as_dict()
    if format == "json":
        sys.stdout.write(json.dumps({"lines": len(prompts), "index": index.counts, **screen, "matches": rows}) + "\n")
    else:
        for name, why in screen["skipped"].items():
            err.print(f"[yellow]not screened against {name}: {why}[/]")
        t = Table(title=f"{len(rows)} of {len(prompts)} line(s) match a benchmark item")
        for c in ("line", "benchmark", "item_id", "tier", "similarity", "item_excerpt"):
            add_column(t, c)
        for r in rows:
            t.add_row(str(r["line"]), r["benchmark"], r["item_id"], r["tier"], f"{r['similarity']:.3f}", r["item_excerpt"][:80])
        print_table(t)
        if not rows:
            console.print(f"clean: no line matches any of {len(index.items)} items ({index.counts})")
    raise typer.Exit(1 if rows else 0)
