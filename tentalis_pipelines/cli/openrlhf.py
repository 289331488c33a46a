"""Training on OpenRLHF: `tentalis reward-server` (its remote reward contract), `tentalis openrlhf export`
(prompts and labels from pinned Delta versions) and `tentalis openrlhf import` (the adapter that comes back,
as a checkpoint with lineage to the export). docs/launchers.md has the `ray job submit` command between them.
"""

from __future__ import annotations

import json
from pathlib import Path

import typer

from tentalis_pipelines.cli.common import MAX_PORT, MAX_WORKERS, HomeOpt, app, console, fail, home_paths

openrlhf_app = typer.Typer(help="Hand training to OpenRLHF on Ray: export prompts with labels, import the adapter back.")
app.add_typer(openrlhf_app, name="openrlhf")


@app.command("reward-server")
def reward_server(
    host: str = typer.Option("127.0.0.1", help="Interface to listen on (0.0.0.0 for a Ray cluster's nodes)."),
    port: int = typer.Option(5000, min=1, max=MAX_PORT, help="Port to listen on."),
    log: Path | None = typer.Option(None, "--log", help="Append every scored sample to this JSONL file."),
    workers: int = typer.Option(2, min=1, max=MAX_WORKERS, help="Scoring processes (requests scored at once)."),
    sample_timeout: float = typer.Option(1.0, min=0.01, max=600.0, help="Seconds one sample may take to score; past it the "
                                         "sample gets reward 0 with the reason (logged) and its worker is replaced."),
):
    """Serve OpenRLHF's remote reward contract (POST /get_reward: {query, prompts, labels} -> {rewards, scores,
    extra_logs}), scored with Tentalis's answer verifier, step checker and verifier manager, in worker
    processes, each sample under --sample-timeout."""
    import uvicorn

    from tentalis_pipelines.rewards.reward_server import create_app

    uvicorn.run(create_app(log, workers=workers, sample_seconds=sample_timeout), host=host, port=port, log_level="info")


@openrlhf_app.command("export")
def export(
    out: Path = typer.Option(..., "--out", "-o", help="A new folder: prompts.jsonl and manifest.json go there."),
    batch: list[str] = typer.Option([], "--batch", help="Only these task batches (repeatable; default: all)."),
    no_worked_example: bool = typer.Option(False, "--no-worked-example", help="Leave the worked example out of each prompt."),
    home: str | None = HomeOpt,
):
    """Export the math tasks with their reference answers, read at a pinned Delta version, as OpenRLHF's
    prompt dataset (--data.input_key input --data.label_key label --data.apply_chat_template)."""
    from tentalis_pipelines.lakehouse import Lakehouse
    from tentalis_pipelines.training.openrlhf import HandoffError, export_prompts

    paths = home_paths(home)
    try:
        manifest = export_prompts(Lakehouse(paths.lakehouse), out, batches=batch or None, worked_example=not no_worked_example)
    except HandoffError as exc:
        fail(str(exc))
    console.print(f"exported {manifest['rows']} prompts from tasks@{manifest['tables']['tasks']} "
                  f"({len(manifest['batches'])} batches) to {out / 'prompts.jsonl'}: export {manifest['export_id']}")


@openrlhf_app.command("import")
def import_(
    adapter: Path = typer.Argument(..., help="OpenRLHF's --ckpt.output_dir: a LoRA adapter folder (adapter_config.json)."),
    export_dir: Path = typer.Option(..., "--export", help="The `tentalis openrlhf export` folder the adapter trained on."),
    base_model: str | None = typer.Option(None, help="The base model the adapter goes on (default: the policy's, $TENTALIS_MODEL or embedded)."),
    algorithm: str = typer.Option("openrlhf:group_norm", help="Recorded in the checkpoint row (the advantage estimator used)."),
    metrics: str | None = typer.Option(None, help="A JSON object of the run's metrics to record with the checkpoint."),
    home: str | None = HomeOpt,
):
    """Import the adapter as a new checkpoint (not promoted: the benchmarks gate it) with lineage to the export."""
    import os

    from tentalis_pipelines.lakehouse import Lakehouse
    from tentalis_pipelines.policy import PolicySettings
    from tentalis_pipelines.training.openrlhf import HandoffError, import_adapter

    extra = None
    if metrics:
        try:
            extra = json.loads(metrics)
        except json.JSONDecodeError as exc:
            fail(f"--metrics is not JSON ({exc.msg}): give an object such as '{{\"reward_mean\": 0.4}}'")
        if not isinstance(extra, dict):
            fail("--metrics must be a JSON object such as '{\"reward_mean\": 0.4}'")
    paths = home_paths(home)
    base = base_model or PolicySettings(model=os.environ.get("TENTALIS_MODEL") or "embedded").model_name
    try:
        row = import_adapter(Lakehouse(paths.lakehouse), paths.checkpoints, adapter, export_dir, base_model=base,
                             algorithm=algorithm, metrics=extra)
    except HandoffError as exc:
        fail(str(exc))
    console.print(f"imported {adapter} as checkpoint {row['checkpoint_id']} (export {row['export_id']}, not promoted): "
                  f"benchmark it with `tentalis benchmark --checkpoint {row['checkpoint_id']}`")
