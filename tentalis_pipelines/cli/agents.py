"""Commands that land agents' work in the lakehouse: `tentalis serve` (the OpenAI-compatible gateway),
`tentalis keys create|list` (its API keys) and `tentalis ingest-nats` (the seeds' event bus).

The command functions live beside what they drive (``tentalis_pipelines/gateway/``); this module only
registers them.
"""

from __future__ import annotations

import typer

from tentalis_pipelines.cli.common import app
from tentalis_pipelines.gateway import commands as gateway
from tentalis_pipelines.gateway.nats_commands import ingest_nats

app.command("serve")(gateway.serve)
keys_app = typer.Typer(help="API keys of the gateway (bearer key -> tenant).")
keys_app.command("create")(gateway.keys_create)
keys_app.command("list")(gateway.keys_list)
app.add_typer(keys_app, name="keys")
app.command("ingest-nats")(ingest_nats)
