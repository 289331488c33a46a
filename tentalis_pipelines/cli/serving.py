"""`tentalis status`, `promote`, `rollback`, `reconcile`: what serves and how it changes."""

from __future__ import annotations

import json

import typer
from rich.table import Table

from tentalis_pipelines.cli.common import (
    HomeOpt,
    actor_name,
    add_column,
    app,
    console,
    err,
    home_paths,
    print_table,
)


@app.command()
def status(home: str | None = HomeOpt):
    """Batches, trajectories, checkpoints, the last reward, what serves and the serving history."""
    paths = home_paths(home)
    from tentalis_pipelines.lakehouse import Lakehouse
    from tentalis_pipelines.stages.training import summarize

    s = summarize(Lakehouse(paths.lakehouse))
    t = Table(title=f"Tentalis at {paths.home}")
    t.add_column("what")
    add_column(t, "value", justify="right")
    for k in ("batches", "tasks", "rollouts", "trajectories", "quarantined"):
        t.add_row(k, str(s[k]))
    if s["last_batch"]:
        b, reward, acc = s["last_batch"]
        t.add_row("last batch", b)
        t.add_row("last reward (mean)", f"{reward:.3f}")
        t.add_row("last accuracy", f"{acc:.3f}")
    console.print(t)
    if s["checkpoints"]:
        c = Table(title="checkpoints")
        for col in ("checkpoint_id", "parent", "promoted", "trajectories", "loss", "reward_mean"):
            add_column(c, col)
        for cid, parent, promoted, n, metrics, _ in s["checkpoints"]:
            m = json.loads(metrics)
            c.add_row(cid, parent or "base", "yes" if promoted else "no", str(n), f"{m.get('loss', 0):.4f}", f"{m.get('reward_mean', 0):.3f}")
        print_table(c)
    _print_serving(Lakehouse(paths.lakehouse))


def _print_serving(lake) -> None:
    from tentalis_pipelines.training import checkpoints as ckpt
    from tentalis_pipelines.training.serving import serving_checkpoint, serving_history

    console.print(f"serving: [bold]{serving_checkpoint(lake)}[/]")
    history = serving_history(lake)
    if history:
        h = Table(title="serving history (newest last; the last row serves)")
        for col in ("seq", "from", "to", "action", "actor", "reason", "at"):
            add_column(h, col)
        for r in history[-20:]:
            h.add_row(str(r["seq"]), r["from_checkpoint"], r["to_checkpoint"], r["action"], r["actor"], r["reason"],
                      f"{r['created_at']:%Y-%m-%d %H:%M:%S}")
        print_table(h)
    for claim in ckpt.active_claims(lake):
        state = "training" if claim.alive() else "stale: `tentalis reconcile` settles it"
        console.print(f"training claim on {claim.policy_version}: {claim.holder()} ({state})")


def reconcile_home(paths) -> dict:
    from dagster import DagsterInstance

    from jobs.run_health import reap_dead_runs
    from tentalis_pipelines.lakehouse import Lakehouse
    from tentalis_pipelines.training.checkpoints import reconcile as run_reconcile

    report = run_reconcile(Lakehouse(paths.lakehouse), paths)
    report["killed_runs_failed_and_slots_freed"] = reap_dead_runs(DagsterInstance.get())
    for key, items in report.items():
        if items:
            console.print(f"reconcile: {key.replace('_', ' ')}: {', '.join(items)}")
    return report


RoleOpt = typer.Option("worker", "--role", help="worker (the policy) | manager (the llm manager's adapter, training/manager_rl.py).")


@app.command()
def promote(
    checkpoint_id: str = typer.Argument(..., help="The checkpoint to serve (or 'base')."),
    reason: str = typer.Option(..., "--reason", help="Why (kept in the serving history)."),
    actor: str | None = typer.Option(None, "--actor", help="Who (default: $USER, else 'cli')."),
    role: str = RoleOpt,
    home: str | None = HomeOpt,
):
    """Serve CHECKPOINT_ID from the next rollout on (recorded in the `serving` table; `--role manager`: the
    manager's checkpoint that writes the llm reviews, in `manager_serving`)."""
    paths = home_paths(home)
    from tentalis_pipelines.lakehouse import Lakehouse
    from tentalis_pipelines.training.serving import ServingError
    from tentalis_pipelines.training.serving import promote as do_promote

    try:
        row = do_promote(Lakehouse(paths.lakehouse), checkpoint_id, actor=actor_name(actor), reason=reason, role=role)
    except (ServingError, ValueError) as exc:
        err.print(f"[red]error:[/] {exc}")
        raise typer.Exit(2) from None
    console.print(f"serving [bold]{row['to_checkpoint']}[/] (was {row['from_checkpoint']}; seq {row['seq']})")


@app.command()
def rollback(
    reason: str = typer.Option(..., "--reason", help="Why (kept in the serving history)."),
    to: str | None = typer.Option(None, "--to", help="Checkpoint id or 'base' (default: what served before the current one)."),
    actor: str | None = typer.Option(None, "--actor", help="Who (default: $USER, else 'cli')."),
    role: str = RoleOpt,
    home: str | None = HomeOpt,
):
    """Go back to what served before the current policy (or to --to); recorded in the `serving` table
    (`--role manager`: the manager's, in `manager_serving`)."""
    paths = home_paths(home)
    from tentalis_pipelines.lakehouse import Lakehouse
    from tentalis_pipelines.training.serving import ServingError
    from tentalis_pipelines.training.serving import rollback as do_rollback

    try:
        row = do_rollback(Lakehouse(paths.lakehouse), actor=actor_name(actor), reason=reason, to=to, role=role)
    except (ServingError, ValueError) as exc:
        err.print(f"[red]error:[/] {exc}")
        raise typer.Exit(2) from None
    console.print(f"serving [bold]{row['to_checkpoint']}[/] (rolled back from {row['from_checkpoint']}; seq {row['seq']})")


@app.command()
def reconcile(home: str | None = HomeOpt):
    """Settle what crashed training runs left: stale claims, unfinished promotions, orphan adapter folders
    and temporary folders of dead writers (every training run does this first, too)."""
    paths = home_paths(home)
    report = reconcile_home(paths)
    if not any(report.values()):
        console.print("nothing to reconcile")
