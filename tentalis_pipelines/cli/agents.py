"""Commands that land agents' work in the lakehouse: `tentalis ingest-nats` (the seeds' event bus).

The command functions live beside what they drive (``tentalis_pipelines/gateway/``); this module only
registers them.
"""

from __future__ import annotations

from tentalis_pipelines.cli.common import app
from tentalis_pipelines.gateway.nats_commands import ingest_nats

app.command("ingest-nats")(ingest_nats)
