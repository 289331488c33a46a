"""`tentalis ui`: the Dagster webserver and daemon on this home."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import typer

from tentalis_pipelines.cli.common import (
    MAX_PORT,
    HomeOpt,
    app,
    err,
    home_paths,
)


@app.command()
def ui(home: str | None = HomeOpt, port: int = typer.Option(3000, min=1, max=MAX_PORT, help="Web server port.")):
    """Start the Dagster UI and daemon (`dagster dev -w workspace.yaml`)."""
    home_paths(home)
    root = Path(__file__).resolve().parents[2]  # the checkout: tentalis_pipelines/cli/ui.py
    workspace = root / "workspace.yaml"
    if not workspace.exists():
        err.print(f"[red]workspace.yaml not found at {workspace}[/]: run `tentalis ui` from a Tentalis checkout")
        raise typer.Exit(2)
    os.chdir(root)
    # The dagster next to this interpreter: `.venv/bin/tentalis ui` works without an activated venv.
    dagster = Path(sys.executable).parent / "dagster"
    os.execv(str(dagster), [str(dagster), "dev", "-w", str(workspace), "-p", str(port)])

