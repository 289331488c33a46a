"""`tentalis lineage`, `retract`, `audit`: what taught a checkpoint, withdrawing data, who decided what."""

from __future__ import annotations

import json

import typer
from rich.table import Table

from tentalis_pipelines.cli.common import (
    MAX_COUNT,
    HomeOpt,
    actor_name,
    add_column,
    app,
    console,
    fail,
    home_paths,
    print_table,
)

_SHOW = 10  # ids listed per kind in the Rich view (--json has them all)


@app.command()
def lineage(
    checkpoint_id: str = typer.Argument(..., help="The checkpoint whose lineage manifest to show."),
    as_json: bool = typer.Option(False, "--json", help="Print the whole manifest as JSON (every id)."),
    verify: bool = typer.Option(False, "--verify", help="Replay the training set with Delta time travel and compare its digest."),
    home: str | None = HomeOpt,
):
    """What taught CHECKPOINT_ID: table versions, trajectory/review/hint/skill ids, config, code version, parent."""
    paths = home_paths(home)
    from tentalis_pipelines import lineage as lin
    from tentalis_pipelines.lakehouse import Lakehouse

    lake = Lakehouse(paths.lakehouse)
    try:
        manifest = lin.load_manifest(lake, checkpoint_id)
        check = lin.verify_replay(lake, checkpoint_id) if verify else None
    except lin.LineageError as exc:
        fail(str(exc))
    if as_json:
        out = dict(manifest)
        if check is not None:
            out["replay"] = {"matches": check[0], **check[1]}
        typer.echo(json.dumps(out, indent=1, sort_keys=True, default=str))
        if check is not None and not check[0]:
            raise typer.Exit(1)
        return
    code = manifest["code_version"]
    head = Table(title=f"lineage of {checkpoint_id}", show_header=False)
    add_column(head, "what")
    add_column(head, "value")
    head.add_row("parent", manifest["parent_id"] or "base")
    head.add_row("ancestors", ", ".join(manifest["ancestors"]) or "-")
    head.add_row("base model", f"{manifest['base_model']} ({manifest['model']})")
    head.add_row("code", f"git {code.get('git_commit') or '-'}{' (dirty)' if code.get('git_dirty') else ''}, "
                         f"package {code.get('package_version') or '-'}")
    cfg = manifest["config"]
    head.add_row("config", ", ".join(f"{k}={cfg[k]}" for k in ("loss_type", "learning_rate", "beta", "per_step_rows", "seed") if k in cfg))
    head.add_row("batches", ", ".join(manifest["batches"]))
    head.add_row("samples", f"{manifest['samples']} (sha256 {manifest['samples_digest'][:16]}…)")
    if check is not None:
        head.add_row("replay", ("[green]matches[/]" if check[0] else "[red]DIFFERS[/]") + f" ({check[1]['samples']} samples)")
    print_table(head)
    versions = Table(title="table versions read")
    add_column(versions, "table")
    add_column(versions, "version", justify="right")
    for name, v in sorted(manifest["tables"].items()):
        versions.add_row(name, "-" if v is None else str(v))
    print_table(versions)
    ids = Table(title=f"rows trained on (first {_SHOW} of each; --json lists all)")
    for col in ("kind", "count", "ids"):
        add_column(ids, col)
    for kind, items in (("trajectories", [t["rollout_id"] for t in manifest["trajectories"]]),
                        ("reviews", [r["review_key"] for r in manifest["reviews"]]),
                        ("hints", [r["review_key"] for r in manifest["hints"]]), ("skills", list(manifest["skills"]))):
        more = f" … +{len(items) - _SHOW}" if len(items) > _SHOW else ""
        ids.add_row(kind, str(len(items)), ", ".join(items[:_SHOW]) + more)
    print_table(ids)
    if check is not None and not check[0]:
        raise typer.Exit(1)


@app.command()
def retract(
    reason: str = typer.Option(..., "--reason", help="Why (kept in the audit table)."),
    review: str | None = typer.Option(None, "--review", help="A review_id, or batch_id/rollout_id/manager for a pipeline review."),
    session: str | None = typer.Option(None, "--session", help="A gateway session id."),
    task: str | None = typer.Option(None, "--task", help="A task id."),
    actor: str | None = typer.Option(None, "--actor", help="Who (default: $USER, else 'cli')."),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
    home: str | None = HomeOpt,
):
    """Delete a review, session or task and everything derived from it (Delta delete + vacuum), list the
    checkpoints trained on it, move serving off them, and record it all in `audit`."""
    paths = home_paths(home)
    from tentalis_pipelines.lakehouse import Lakehouse
    from tentalis_pipelines.retraction import RetractionError
    from tentalis_pipelines.retraction import retract as do_retract
    from tentalis_pipelines.training.serving import ServingError

    try:
        result = do_retract(Lakehouse(paths.lakehouse), review=review, session=session, task=task, reason=reason, actor=actor_name(actor))
    except (RetractionError, ServingError) as exc:
        fail(str(exc))
    if as_json:
        typer.echo(json.dumps(result.as_dict(), indent=1, sort_keys=True, default=str))
        return
    t = Table(title=f"retracted {result.kind} {result.target}")
    for col in ("table", "rows deleted", "files vacuumed"):
        add_column(t, col)
    for name in result.deleted:
        t.add_row(name, str(result.deleted[name]), str(result.vacuumed_files.get(name, 0)))
    print_table(t)
    if result.affected:
        a = Table(title="checkpoints trained on it (never served again)")
        add_column(a, "checkpoint_id")
        add_column(a, "how")
        for cid, how in result.affected.items():
            a.add_row(cid, how)
        print_table(a)
    else:
        console.print("no checkpoint was trained on it")
    moved = result.serving_after != result.serving_before
    console.print(f"serving: [bold]{result.serving_after}[/]" + (f" (was {result.serving_before})" if moved else " (unchanged)"))


@app.command("audit")
def audit_log(
    limit: int = typer.Option(30, "--limit", min=1, max=MAX_COUNT, help="Newest rows to show."),
    home: str | None = HomeOpt,
):
    """Promotions, rollbacks, gate decisions and retractions: who, when, what, why (the `audit` table)."""
    paths = home_paths(home)
    from tentalis_pipelines import audit
    from tentalis_pipelines.lakehouse import Lakehouse

    rows = audit.rows(Lakehouse(paths.lakehouse))[-limit:]
    t = Table(title="audit (newest last)")
    for col in ("at", "actor", "action", "subject", "from", "to", "reason"):
        add_column(t, col)
    for r in rows:
        t.add_row(f"{r['at']:%Y-%m-%d %H:%M:%S}", r["actor"], r["action"], r["subject"] or "", r["from_state"] or "", r["to_state"] or "",
                  r["reason"])
    print_table(t)
