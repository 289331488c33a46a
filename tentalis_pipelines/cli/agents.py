"""Commands that land agents' work in the lakehouse: `tentalis serve` (the OpenAI-compatible gateway),
`tentalis keys create|list` (its API keys) and `tentalis ingest-nats` (the seeds' event bus).

Light on purpose: the CLI imports this module at start-up; the gateway, nats, deltalake and the rest load
inside the commands.
"""

from __future__ import annotations

import json
import os
import sys

import typer
from rich.table import Table

from tentalis_pipelines.cli.common import (
    MAX_COUNT,
    MAX_PORT,
    MAX_SAMPLES,
    HomeOpt,
    app,
    console,
    err,
    home_paths,
)

DEFAULT_STREAM = "TENTALIS"
DEFAULT_DURABLE = "tentalis-ingest"



@app.command("serve")
def serve(
    host: str = typer.Option("127.0.0.1", help="Interface to listen on."),
    port: int = typer.Option(8000, min=1, max=MAX_PORT, help="Port to listen on."),
    model: str | None = typer.Option(None, help="'embedded' (default) or a local model folder: the base model the serving "
                                                "checkpoint's adapter goes on. With --upstream: optional, its tokenizer "
                                                "templates the recorded prompt ids."),
    upstream: str | None = typer.Option(None, help="Forward to this OpenAI-compatible server (e.g. http://127.0.0.1:8001/v1) "
                                                   "while recording; its key comes from $TENTALIS_UPSTREAM_API_KEY."),
    model_name: str | None = typer.Option(None, help="The model id clients ask for (default: the model folder's name; "
                                                     "with --upstream: the upstream's model)."),
    no_auth: bool = typer.Option(False, "--no-auth", help="Local use: no API keys, every request in tenant 'local'."),
    flush_interval: float = typer.Option(0.5, help="Seconds between WAL flushes into Delta."),
    poll_seconds: float = typer.Option(2.0, help="Seconds between checks of the serving pointer (0: never switch)."),
    device: str = typer.Option("auto", help="auto | cpu | cuda"),
    dtype: str = typer.Option("auto", help="auto | float32 | bfloat16"),
    max_batch_rows: int = typer.Option(64, min=1, max=MAX_SAMPLES, help="Continuous batching: choices decoded together at most (calls "
                                                       "arriving meanwhile join at the next token); 1 serves one call at a time."),
    max_prompts: int = typer.Option(16, min=1, max=MAX_SAMPLES, help="Prompts one /v1/completions call may hold (more: 422 too_many_prompts)."),
    quarantine_per_minute: int = typer.Option(30, min=0, max=MAX_COUNT, help="Rejected review/Bridge bodies one tenant may have kept in "
                                                              "`quarantine` per minute (more are answered, not kept; 0: none)."),
    quarantine_raw_chars: int = typer.Option(8192, min=0, max=MAX_COUNT, help="Characters kept of one rejected body (the rest clipped)."),
    home: str | None = HomeOpt,
):
    """Serve the current serving checkpoint over an OpenAI-compatible API; every call lands in `sessions` and `turns`."""
    import uvicorn

    from tentalis_pipelines.gateway.app import GatewayConfig, create_app
    from tentalis_pipelines.inference.models import resolve_model
    from tentalis_pipelines.redact import install_log_filter

    paths = home_paths(home)
    install_log_filter()
    model_dir = None
    if model is not None or upstream is None:
        model_dir = resolve_model(model or "embedded", paths.models)
    cfg = GatewayConfig(home=paths.home, lakehouse=paths.lakehouse, model_dir=model_dir, model_name=model_name, upstream=upstream,
                        upstream_api_key=os.environ.get("TENTALIS_UPSTREAM_API_KEY"), no_auth=no_auth,
                        flush_interval=flush_interval, poll_seconds=poll_seconds, device=device, dtype=dtype,
                        max_batch_rows=max_batch_rows, max_prompts=max_prompts, quarantine_per_minute=quarantine_per_minute,
                        quarantine_raw_chars=quarantine_raw_chars)
    if no_auth:
        typer.echo("warning: --no-auth: every request is tenant 'local' (do not expose this port)", err=True)
    uvicorn.run(create_app(cfg), host=host, port=port, log_level="info", timeout_graceful_shutdown=30)


keys_app = typer.Typer(help="API keys of the gateway (bearer key -> tenant).")
app.add_typer(keys_app, name="keys")


@keys_app.command("create")
def keys_create(
    tenant: str = typer.Option(..., help="The tenant the key's requests and rows belong to."),
    name: str | None = typer.Option(None, help="A label for the key (who holds it)."),
    home: str | None = HomeOpt,
):
    """Make an API key for a tenant: printed once, stored only as its sha256."""
    from tentalis_pipelines.gateway.auth import create_key

    paths = home_paths(home)
    try:
        key, record = create_key(paths.home, tenant, name=name)
    except ValueError as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(2) from None
    typer.echo(f"created {record['key_id']} for tenant {tenant!r}; the key is shown only now:", err=True)
    typer.echo(key)


@keys_app.command("list")
def keys_list(home: str | None = HomeOpt):
    """The API keys (id, tenant, name, first characters, created); never the keys themselves."""
    from tentalis_pipelines.gateway.auth import list_keys

    paths = home_paths(home)
    t = Table()
    for c in ("key_id", "tenant", "name", "prefix", "created_at"):
        t.add_column(c)
    for r in list_keys(paths.home):
        t.add_row(*[str(r.get(c, "")) for c in ("key_id", "tenant", "name", "prefix", "created_at")])
    console.print(t)


@app.command("ingest-nats")
def ingest_nats(
    url: str = typer.Option(os.environ.get("TENTALIS_NATS_URL", "nats://127.0.0.1:4222"), "--url",
                            help="NATS server (default: $TENTALIS_NATS_URL or nats://127.0.0.1:4222)."),
    stream: str = typer.Option(DEFAULT_STREAM, help="JetStream stream (created on the subjects when absent)."),
    subjects: str = typer.Option("tentalis.>", help="Comma-separated subjects to consume, e.g. 'tentalis.>' or "
                                 "the seeds' 'tasks.>,results.>,feedback.>'."),
    durable: str = typer.Option(DEFAULT_DURABLE, help="Durable consumer name: a restart resumes where it stopped."),
    tenant: str = typer.Option(..., help="Tenant every landed row belongs to."),
    batch: int = typer.Option(32, min=1, max=MAX_COUNT, help="Messages fetched per pull."),
    ack_wait: float = typer.Option(30.0, min=0.1, help="Seconds before an unacknowledged message is redelivered (new consumers)."),
    max_messages: int | None = typer.Option(None, min=1, max=MAX_COUNT, help="Stop after this many messages are handled."),
    idle_exit: float | None = typer.Option(None, min=0.0, help="Stop after this many seconds without a message."),
    create_stream: bool = typer.Option(True, help="Create the stream when it does not exist."),
    home: str | None = HomeOpt,
):
    """Land the seeds' NATS task/result/feedback events in tasks, rollouts and reviews (JetStream durable
    pull consumer; a message is acked only after its row is committed; bad messages are quarantined)."""
    from tentalis_pipelines.gateway.bridge import BridgeInputError
    from tentalis_pipelines.gateway.nats_ingest import IngestConfig, run_ingest
    from tentalis_pipelines.lakehouse import Lakehouse
    from tentalis_pipelines.redact import redact

    paths = home_paths(home)
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
