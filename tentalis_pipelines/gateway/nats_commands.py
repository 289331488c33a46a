"""``tentalis ingest-nats``: the Typer command (registered in ``tentalis_pipelines/cli/agents.py``)."""

from __future__ import annotations

import json
import os
import sys

import typer

# Light on purpose: the CLI imports this module at start-up; nats, deltalake and the rest load in the command.
DEFAULT_STREAM = "TENTALIS"
DEFAULT_DURABLE = "tentalis-ingest"


def ingest_nats(
    url: str = typer.Option(os.environ.get("TENTALIS_NATS_URL", "nats://127.0.0.1:4222"), "--url",
                            help="NATS server (default: $TENTALIS_NATS_URL or nats://127.0.0.1:4222)."),
    stream: str = typer.Option(DEFAULT_STREAM, help="JetStream stream (created on the subjects when absent)."),
    subjects: str = typer.Option("tentalis.>", help="Comma-separated subjects to consume, e.g. 'tentalis.>' or "
                                 "the seeds' 'tasks.>,results.>,feedback.>'."),
    durable: str = typer.Option(DEFAULT_DURABLE, help="Durable consumer name: a restart resumes where it stopped."),
    tenant: str = typer.Option(..., help="Tenant every landed row belongs to."),
    batch: int = typer.Option(32, min=1, help="Messages fetched per pull."),
    ack_wait: float = typer.Option(30.0, min=0.1, help="Seconds before an unacknowledged message is redelivered (new consumers)."),
    max_messages: int | None = typer.Option(None, min=1, help="Stop after this many messages are handled."),
    idle_exit: float | None = typer.Option(None, min=0.0, help="Stop after this many seconds without a message."),
    create_stream: bool = typer.Option(True, help="Create the stream when it does not exist."),
    home: str | None = typer.Option(None, "--home", help="State folder (default: $TENTALIS_HOME or ./.tentalis)."),
):
    """Land the seeds' NATS task/result/feedback events in tasks, rollouts and reviews (JetStream durable
    pull consumer; a message is acked only after its row is committed; bad messages are quarantined)."""
    from tentalis_pipelines.cli.common import _paths, err
    from tentalis_pipelines.gateway.bridge import BridgeInputError
    from tentalis_pipelines.gateway.nats_ingest import IngestConfig, run_ingest
    from tentalis_pipelines.lakehouse import Lakehouse
    from tentalis_pipelines.redact import redact

    paths = _paths(home)
    cfg = IngestConfig(url=url, tenant=tenant, stream=stream, subjects=tuple(s.strip() for s in subjects.split(",") if s.strip()),
                       durable=durable, batch=batch, ack_wait=ack_wait, max_messages=max_messages, idle_exit=idle_exit,
                       create_stream=create_stream)
    err.print(f"ingesting {', '.join(cfg.subjects)} from stream {stream} at {redact(url)} as tenant {tenant!r} "
              f"(durable {durable}) into {paths.lakehouse}")
    try:
        stats = run_ingest(Lakehouse(paths.lakehouse), cfg)
    except (BridgeInputError, ValueError, RuntimeError, OSError) as exc:
        err.print(f"[red]error:[/] {redact(str(exc)) or type(exc).__name__}")
        raise typer.Exit(2) from None
    sys.stdout.write(json.dumps(stats.as_dict()) + "\n")
