"""The gateway's CLI commands (registered in ``tentalis_pipelines.cli``): ``serve``, ``keys create``, ``keys list``."""

from __future__ import annotations

import os

import typer

HomeOpt = typer.Option(None, "--home", help="State folder (default: $TENTALIS_HOME or ./.tentalis).")


def _paths(home: str | None):
    from tentalis_pipelines.cli.common import _paths as cli_paths

    return cli_paths(home)


def serve(
    host: str = typer.Option("127.0.0.1", help="Interface to listen on."),
    port: int = typer.Option(8000, help="Port to listen on."),
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
    home: str | None = HomeOpt,
):
    """Serve the current serving checkpoint over an OpenAI-compatible API; every call lands in `sessions` and `turns`."""
    import uvicorn

    from tentalis_pipelines.gateway.app import GatewayConfig, create_app
    from tentalis_pipelines.inference.models import resolve_model
    from tentalis_pipelines.redact import install_log_filter

    paths = _paths(home)
    install_log_filter()
    model_dir = None
    if model is not None or upstream is None:
        model_dir = resolve_model(model or "embedded", paths.models)
    cfg = GatewayConfig(home=paths.home, lakehouse=paths.lakehouse, model_dir=model_dir, model_name=model_name, upstream=upstream,
                        upstream_api_key=os.environ.get("TENTALIS_UPSTREAM_API_KEY"), no_auth=no_auth,
                        flush_interval=flush_interval, poll_seconds=poll_seconds, device=device, dtype=dtype)
    if no_auth:
        typer.echo("warning: --no-auth: every request is tenant 'local' (do not expose this port)", err=True)
    uvicorn.run(create_app(cfg), host=host, port=port, log_level="info", timeout_graceful_shutdown=30)


def keys_create(
    tenant: str = typer.Option(..., help="The tenant the key's requests and rows belong to."),
    name: str | None = typer.Option(None, help="A label for the key (who holds it)."),
    home: str | None = HomeOpt,
):
    """Make an API key for a tenant: printed once, stored only as its sha256."""
    from tentalis_pipelines.gateway.auth import create_key

    paths = _paths(home)
    try:
        key, record = create_key(paths.home, tenant, name=name)
    except ValueError as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(2) from None
    typer.echo(f"created {record['key_id']} for tenant {tenant!r}; the key is shown only now:", err=True)
    typer.echo(key)


def keys_list(home: str | None = HomeOpt):
    """The API keys (id, tenant, name, first characters, created); never the keys themselves."""
    from rich.console import Console
    from rich.table import Table

    from tentalis_pipelines.gateway.auth import list_keys

    paths = _paths(home)
    t = Table()
    for c in ("key_id", "tenant", "name", "prefix", "created_at"):
        t.add_column(c)
    for r in list_keys(paths.home):
        t.add_row(*[str(r.get(c, "")) for c in ("key_id", "tenant", "name", "prefix", "created_at")])
    Console().print(t)
