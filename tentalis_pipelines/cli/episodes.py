"""`tentalis episodes export|import`: agent episodes as Harbor's ATIF v1.4 trajectories (``episodes.py``)."""

from __future__ import annotations

from pathlib import Path

import typer

from tentalis_pipelines.cli.common import MAX_COUNT, HomeOpt, app, console, fail, home_paths

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
    replace: bool = typer.Option(False, "--replace", help="Replace sessions already landed with other content "
                                 "(their turns, transcript and review) with the file's; without it they are refused."),
    vocab_size: int | None = typer.Option(None, "--vocab-size", min=1, max=MAX_COUNT, help="Token ids must lie in [0, N): the "
                                          "vocabulary of the tokenizer that sampled them (default: the policy's, --model)."),
    model: str | None = typer.Option(None, "--model", help="The policy whose tokenizer's vocabulary bounds the token ids "
                                     "(default $TENTALIS_MODEL, else embedded); read only when a trajectory carries ids."),
    home: str | None = HomeOpt,
):
    """Land ATIF trajectories as live sessions (turns with their token ids and log-probs) and their
    verdicts as the sessions' reviews; the fresh_sessions sensor cuts them into batches that train.
    All or nothing: every trajectory is checked first; the bad ones are named (and kept in quarantine)
    and nothing lands. Re-importing the same file changes nothing; changed content for a session
    already landed is refused unless --replace."""
    if not path.is_file():
        fail(f"{path}: no such file")
    paths = home_paths(home)
    import os

    from tentalis_pipelines import episodes
    from tentalis_pipelines.envs.atif import ATIFError
    from tentalis_pipelines.lakehouse import Lakehouse

    def policy_vocab() -> int:
        name = model or os.environ.get("TENTALIS_MODEL") or "embedded"
        try:
            return episodes.tokenizer_vocab_size(name, paths.models)
        except Exception as exc:  # noqa: BLE001 - no model, no tokenizer files, an unreadable folder: say how to go on
            fail(f"{path}: cannot check the token ids against the vocabulary of the policy {name!r} ({exc}); give "
                 "--vocab-size N (the size of the tokenizer that sampled them) or --model PATH; nothing was imported")

    try:
        out = episodes.import_file(Lakehouse(paths.lakehouse), path, tenant=tenant, replace=replace,
                                   vocab_size=vocab_size if vocab_size is not None else policy_vocab)
    except episodes.PlanErrors as exc:
        fail(f"{path}: {len(exc.problems)} bad trajectory(ies), kept in the quarantine table "
             f"(stage {episodes.QUARANTINE_STAGE!r}):\n{exc}\nfix them and import the file again; nothing was imported")
    except (ATIFError, episodes.ImportRefused) as exc:
        fail(f"{path}: {exc}; nothing was imported")
    console.print(f"imported {out['trajectories']} trajectory(ies): {out['sessions']} new session(s), {out['replaced']} replaced, "
                  f"{out['turns']} turn(s), {out['reviews']} review(s); {out['unchanged']} already there, "
                  f"{out['skipped']} without a policy turn")
