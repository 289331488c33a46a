"""`tentalis data`: the benchmark data folder: what is there (`status`) and downloading it (`fetch`)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer
from rich.table import Table

from tentalis_pipelines.cli.common import app, console, err

data_app = typer.Typer(help="Benchmark data (GSM8K, MATH-500, ProcessBench): what is installed, and fetching it.")
app.add_typer(data_app, name="data")


def _root(dest: Path | None) -> Path:
    from tentalis_pipelines.settings import data_fetch_dir

    return dest.expanduser().resolve() if dest is not None else data_fetch_dir()


@data_app.command("fetch")
def fetch(
    dest: Path | None = typer.Option(None, "--dest", help="Data folder (default: $TENTALIS_DATA_DIR, else $TENTALIS_HOME/data)."),
    only: str = typer.Option("", "--only", help="Comma-separated datasets: gsm8k, math500, processbench (default: all)."),
    force: bool = typer.Option(False, "--force", help="Download again and replace files already there."),
    mirror: str | None = typer.Option(None, "--mirror", help="Fetch from <mirror>/<upstream host><path> (default: $TENTALIS_DATA_MIRROR)."),
    timeout: float = typer.Option(60.0, min=1, help="Seconds to wait on a connection."),
):
    """Download the benchmark files from their public sources (pinned commits), verify each against its
    pinned sha256 and write it atomically. Files already there with the right digest are skipped.
    Exits 1 naming the file when a download fails or does not match (nothing of it is left behind)."""
    from tentalis_pipelines import datasets

    try:
        names = datasets.parse_only(only)
    except ValueError as exc:
        err.print(f"[red]{exc}[/]")
        raise typer.Exit(2) from None
    root = _root(dest)

    def show(o) -> None:
        mark = "[green]✓ fetched[/]" if o.action == "fetched" else "[dim]= present[/]"
        console.print(f"  {mark} {o.path} [dim]({o.file.records} records, sha256 {o.file.sha256[:12]}…)[/]")

    console.print(f"data folder: [bold]{root}[/]")
    try:
        root.mkdir(parents=True, exist_ok=True)
        datasets.fetch(root, names, mirror=mirror, force=force, timeout=timeout, on_file=show)
    except (datasets.DataFetchError, OSError) as exc:
        err.print(f"[red]{exc}[/]")
        raise typer.Exit(1) from None
    from tentalis_pipelines.settings import data_dir

    if data_dir() != root:
        console.print(f"[yellow]Tentalis reads the data from TENTALIS_DATA_DIR: export TENTALIS_DATA_DIR={root}[/]")


@data_app.command("status")
def status(
    dest: Path | None = typer.Option(None, "--dest", help="Data folder (default: the one Tentalis reads)."),
    format: str = typer.Option("table", "--format", "-f", help="table | json"),
):
    """Which benchmark files are present (with the pinned digest), missing, or different, and where.
    A benchmark whose file is missing is neither evaluated on nor screened against."""
    from tentalis_pipelines import datasets
    from tentalis_pipelines.settings import data_dir

    if format not in ("table", "json"):
        err.print(f"[red]--format must be table or json, not {format!r}[/]")
        raise typer.Exit(2)
    root = dest.expanduser().resolve() if dest is not None else data_dir()
    rows = datasets.status(root)
    if format == "json":
        sys.stdout.write(json.dumps({"data_dir": str(root) if root else None, "files": [r.as_dict() for r in rows]}) + "\n")
        return
    console.print(f"data folder: [bold]{root}[/]" if root else
                  "data folder: [yellow]none[/] (TENTALIS_DATA_DIR is not set and $TENTALIS_HOME/data does not exist)")
    t = Table()
    for c in ("dataset", "state"):
        t.add_column(c)
    t.add_column("path", overflow="fold")
    colour = {"present": "green", "missing": "yellow", "differs": "red", "unreadable": "red"}
    for r in rows:
        t.add_row(r.file.dataset, f"[{colour[r.state]}]{r.state}[/]", str(r.path))
    console.print(t)
    if any(r.state == "missing" for r in rows):
        console.print("fetch the missing files: [bold]tentalis data fetch[/] (needs internet access)")
