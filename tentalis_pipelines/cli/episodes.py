"""`tentalis episodes export|import`: agent episodes as Harbor's ATIF v1.4 trajectories (``episodes.py``)."""

from __future__ import annotations

from pathlib import Path

import typer

from tentalis_pipelines.cli.common import HomeOpt, app, console, fail, home_paths

episodes_app = typer.Typer(help="Agent episodes in and out as ATIF v1.4 trajectories (Harbor's format).")
app.add_typer(episodes_app, name="episodes")


@episodes_app.command("export")
def export(
    out: Path = typer.Option(..., "--out", "-o", help="File to write: .json (one trajectory, or an array) or .jsonl (one per line)."),
    batch: str | None = typer.Option(None, "--batch", help="An environment batch (its episodes) or a sessions batch (its sessions)."),
    session: list[str] = typer.Option([], "--session", help="A session holding an imported episode (repeatable)."),
    home: str | None = HomeOpt,
):
    """Write episodes as ATIF trajectories, with every turn's token ids and sampling log-probs."""
    if bool(batch) == bool(session):
        fail("give --batch ID or --session ID (one of the two)")
    if out.suffix not in (".json", ".jsonl"):
        fail(f"--out {out}: name the file .json or .jsonl")
    paths = home_paths(home)
    from tentalis_pipelines import episodes
    from tentalis_pipelines.envs.atif import write_atif
    from tentalis_pipelines.lakehouse import Lakehouse

    lake = Lakehouse(paths.lakehouse)
    try:
        docs = episodes.export_batch(lake, batch) if batch else episodes.export_sessions(lake, session)
    except episodes.ExportError as exc:
        fail(str(exc))
    n = write_atif(docs, out)
    console.print(f"wrote {n} trajectory(ies) to {out}")


@episodes_app.command("import")
def import_(
    path: Path = typer.Argument(..., help="ATIF trajectories: .json (one, or an array) or .jsonl (one per line)."),
    tenant: str = typer.Option("envs", help="The tenant the sessions land under."),
    home: str | None = HomeOpt,
):
    """Land ATIF trajectories as live sessions (turns with their token ids and log-probs) and their
    verdicts as the sessions' reviews; the fresh_sessions sensor cuts them into batches that train.
    Every trajectory is checked first: a bad field is named and nothing lands."""
    if not path.is_file():
        fail(f"{path}: no such file")
    paths = home_paths(home)
    from tentalis_pipelines import episodes
    from tentalis_pipelines.envs.atif import ATIFError, read_atif
    from tentalis_pipelines.lakehouse import Lakehouse

    try:
        out = episodes.import_episodes(Lakehouse(paths.lakehouse), read_atif(path), tenant=tenant)
    except (ATIFError, episodes.ImportRefused) as exc:
        fail(f"{path}: {exc}; nothing was imported")
    console.print(f"imported {out['trajectories']} trajectory(ies): {out['sessions']} new session(s), {out['turns']} turn(s), "
                  f"{out['reviews']} review(s); {out['unchanged']} already there, {out['skipped']} without a policy turn")
