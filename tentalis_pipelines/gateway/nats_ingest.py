"""Land the seeds' NATS task/result/feedback events in the lakehouse (``tentalis ingest-nats``).

A JetStream durable pull consumer reads the stream; each message goes through the same landing
functions as the Bridge HTTP API (:mod:`tentalis_pipelines.gateway.bridge`):

==============================================  =====================  ==========
subject                                         lands with              table
==============================================  =====================  ==========
``tentalis.tasks.assign``, ``tasks.<type>``     ``land_task_assign``   tasks
``tentalis.tasks.result``, ``results.<type>``   ``land_task_result``   rollouts
``tentalis.feedback``, ``feedback.<anything>``  ``land_feedback``      reviews
==============================================  =====================  ==========

(The ``tentalis.`` prefix is optional: the seeds published ``tasks.coding``, ``results.coding`` and
``feedback.scored``; a ``tasks.<type>`` event without ``task_type`` gets ``<type>``.)

Guarantees: a message is acknowledged only after its row is committed to Delta (``ack_sync``: the server
confirmed the ack). A crash between the commit and the ack makes JetStream deliver the message again
after ``ack_wait``; landing is idempotent (stable ids, merge by key), so the redelivery changes nothing.
At-least-once delivery plus idempotent landing: every event lands exactly once. A bad message (not JSON,
not an object, a field the Bridge refuses, an unknown task id) is kept in ``quarantine`` (secrets redacted)
and terminated (``term``): it is never redelivered and never blocks the stream. A message whose landing
fails for another reason (the lakehouse cannot be written) is not acknowledged (``nak`` with a delay) and
comes back. Messages on subjects that are none of the three are acknowledged and skipped (counted).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tentalis_pipelines.gateway.bridge import LANDERS, BridgeInputError, quarantine_payload, tenant_slug
from tentalis_pipelines.lakehouse import Lakehouse
from tentalis_pipelines.redact import redact

log = logging.getLogger(__name__)

ACK_TIMEOUT = 10.0  # seconds to wait for the server to confirm an ack (nats-py defaults to 1 s: too short on a busy host)
DEFAULT_STREAM = "TENTALIS"
DEFAULT_SUBJECTS = ("tentalis.>",)
DEFAULT_DURABLE = "tentalis-ingest"


def subject_kind(subject: str) -> tuple[str | None, str | None]:
    """``(kind, task_type)`` of a subject: kind is assign | result | feedback, or None for other subjects;
    task_type is the ``<type>`` of the seeds' ``tasks.<type>`` / ``results.<type>`` subjects."""
    tokens = subject.split(".")
    if tokens and tokens[0] == "tentalis":
        tokens = tokens[1:]
    if not tokens:
        return None, None
    head, rest = tokens[0], tokens[1:]
    if head == "tasks" and rest == ["assign"]:
        return "assign", None
    if head == "tasks" and rest == ["result"]:
        return "result", None
    if head == "tasks" and len(rest) == 1:
        return "assign", rest[0]
    if head == "results" and len(rest) <= 1:
        return "result", rest[0] if rest else None
    if head == "feedback":
        return "feedback", None
    return None, None


@dataclass
class IngestConfig:
    url: str = "nats://127.0.0.1:4222"
    tenant: str = "default"
    stream: str = DEFAULT_STREAM
    subjects: tuple[str, ...] = DEFAULT_SUBJECTS
    durable: str = DEFAULT_DURABLE
    batch: int = 32
    fetch_timeout: float = 1.0
    ack_wait: float = 30.0
    nak_delay: float = 5.0
    max_messages: int | None = None
    idle_exit: float | None = None
    create_stream: bool = True
    connect_timeout: float = 5.0


@dataclass
class IngestStats:
    landed: int = 0
    unchanged: int = 0
    rejected: int = 0
    skipped: int = 0
    failed: int = 0
    redelivered: int = 0
    by_kind: dict[str, int] = field(default_factory=dict)

    @property
    def handled(self) -> int:
        """Messages acknowledged or terminated (a failed landing is neither: it comes back)."""
        return self.landed + self.unchanged + self.rejected + self.skipped

    def as_dict(self) -> dict[str, Any]:
        return {"landed": self.landed, "unchanged": self.unchanged, "rejected": self.rejected, "skipped": self.skipped,
                "failed": self.failed, "redelivered": self.redelivered, "by_kind": dict(self.by_kind)}


async def _ensure_stream(js, cfg: IngestConfig) -> None:
    import nats.js.errors

    try:
        await js.stream_info(cfg.stream)
    except nats.js.errors.NotFoundError:
        if not cfg.create_stream:
            raise RuntimeError(f"JetStream stream {cfg.stream!r} does not exist: create it, or leave out --no-create-stream") from None
        await js.add_stream(name=cfg.stream, subjects=list(cfg.subjects))
        log.info("created JetStream stream %s on %s", cfg.stream, ", ".join(cfg.subjects))


async def _subscribe(nc, js, cfg: IngestConfig):
    """Bind to the durable pull consumer, creating it on first use (explicit acks, ``ack_wait``)."""
    import nats.js.errors
    from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

    try:
        await js.consumer_info(cfg.stream, cfg.durable)
    except nats.js.errors.NotFoundError:
        config = ConsumerConfig(durable_name=cfg.durable, ack_policy=AckPolicy.EXPLICIT, deliver_policy=DeliverPolicy.ALL,
                                ack_wait=cfg.ack_wait, max_ack_pending=max(1000, cfg.batch * 4))
        if len(cfg.subjects) == 1:
            config.filter_subject = cfg.subjects[0]
        elif nc.connected_server_version.minor >= 10 or nc.connected_server_version.major > 2:
            config.filter_subjects = list(cfg.subjects)
        # else (nats-server < 2.10 has no filter_subjects): the consumer reads the whole stream, and
        # subjects that are none of the Bridge's three are acknowledged and skipped.
        await js.add_consumer(cfg.stream, config=config)
    return await js.pull_subscribe_bind(durable=cfg.durable, stream=cfg.stream)


async def _handle(msg, lake: Lakehouse, cfg: IngestConfig, stats: IngestStats,
                  before_ack: Callable[[Any, dict[str, Any]], Any] | None) -> None:
    meta = msg.metadata
    if meta.num_delivered > 1:
        stats.redelivered += 1
    kind, task_type = subject_kind(msg.subject)
    if kind is None:
        await msg.ack_sync(timeout=ACK_TIMEOUT)
        stats.skipped += 1
        return
    source = f"nats:{msg.subject}"
    seq = meta.sequence.stream
    try:
        try:
            payload = json.loads(msg.data)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            error = f"message {seq} on {msg.subject} is not JSON ({exc.msg if hasattr(exc, 'msg') else exc}): publish one JSON object per event"
            await asyncio.to_thread(quarantine_payload, lake, kind, msg.data, error, cfg.tenant, source=source, line=seq)
            raise BridgeInputError(error, field="payload") from None
        if task_type and isinstance(payload, dict) and payload.get("task_type") is None:
            payload = {**payload, "task_type": task_type}
        out = await asyncio.to_thread(LANDERS[kind], lake, payload, cfg.tenant, source=source, line=seq)
    except BridgeInputError as exc:
        log.warning("quarantined message %s on %s: %s", seq, msg.subject, redact(str(exc)))
        await msg.term()
        stats.rejected += 1
        return
    except Exception as exc:  # noqa: BLE001 - the lakehouse failed: do not ack, the message comes back
        log.error("landing message %s on %s failed, it will be redelivered: %s", seq, msg.subject, redact(repr(exc)))
        stats.failed += 1
        with contextlib.suppress(Exception):
            await msg.nak(delay=cfg.nak_delay)
        return
    # The row is committed: only now acknowledge (a crash before this line means a redelivery, which lands nothing new).
    if before_ack is not None:
        before_ack(msg, out)
    await msg.ack_sync(timeout=ACK_TIMEOUT)
    stats.by_kind[kind] = stats.by_kind.get(kind, 0) + 1
    if out.get("status") == "unchanged":
        stats.unchanged += 1
    else:
        stats.landed += 1


async def ingest(
    lake: Lakehouse, cfg: IngestConfig, *, stop: asyncio.Event | None = None,
    before_ack: Callable[[Any, dict[str, Any]], Any] | None = None,
) -> IngestStats:
    """Consume the stream until ``stop`` is set, ``max_messages`` are handled, or nothing came for
    ``idle_exit`` seconds. ``before_ack(msg, result)`` runs after a row is committed and before its ack
    (tests use it to crash there)."""
    import nats
    import nats.errors

    tenant_slug(cfg.tenant)  # refuse a bad tenant before connecting
    if not cfg.subjects:
        raise ValueError("no subjects to consume: pass --subjects (e.g. 'tentalis.>')")
    stats = IngestStats()
    nc = await nats.connect(cfg.url, name="tentalis-ingest", connect_timeout=cfg.connect_timeout, max_reconnect_attempts=-1,
                            allow_reconnect=True)
    try:
        js = nc.jetstream(timeout=30.0)  # JetStream API calls (stream, consumer, ack_sync): generous on a busy host
        await _ensure_stream(js, cfg)
        sub = await _subscribe(nc, js, cfg)
        last = time.monotonic()
        while not (stop is not None and stop.is_set()):
            if cfg.max_messages is not None and stats.handled >= cfg.max_messages:
                break
            want = cfg.batch if cfg.max_messages is None else max(1, min(cfg.batch, cfg.max_messages - stats.handled))
            try:
                msgs = await sub.fetch(want, timeout=cfg.fetch_timeout)
            except (nats.errors.TimeoutError, asyncio.TimeoutError):
                # nats-py raises its own TimeoutError for an empty pull, but a plain asyncio one when the
                # pull request itself times out (seen on a loaded host): both mean "nothing yet".
                msgs = []
            if not msgs:
                if cfg.idle_exit is not None and time.monotonic() - last >= cfg.idle_exit:
                    break
                continue
            last = time.monotonic()
            for msg in msgs:
                await _handle(msg, lake, cfg, stats, before_ack)
    finally:
        with contextlib.suppress(Exception):
            await nc.close()
    return stats


def run_ingest(lake: Lakehouse, cfg: IngestConfig) -> IngestStats:
    """``ingest`` in a fresh event loop; SIGINT/SIGTERM stop it after the message in hand (acked or not)."""

    async def main() -> IngestStats:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.add_signal_handler(sig, stop.set)
        return await ingest(lake, cfg, stop=stop)

    return asyncio.run(main())
