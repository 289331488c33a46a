"""`tentalis ingest-nats` against a real nats-server with JetStream, started by the test."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("nats", reason="nats-py is not installed (pip install nats-py)")

from local_servers import NatsServer, ServerUnavailable, skip_unavailable  # noqa: E402

from tentalis_pipelines.gateway import nats_ingest  # noqa: E402
from tentalis_pipelines.gateway.nats_ingest import IngestConfig, ingest, subject_kind  # noqa: E402
from tentalis_pipelines.lakehouse import Lakehouse  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def _hash_id(kind: str, *parts) -> str:
    return f"{kind}-{hashlib.sha256(json.dumps([kind, *parts], sort_keys=True).encode()).hexdigest()[:20]}"


@pytest.fixture()
def server():
    try:
        srv = NatsServer().start()
    except ServerUnavailable as exc:
        skip_unavailable("nats-server", exc)
    yield srv
    srv.stop()


async def _publish(url: str, events: list[tuple[str, object]], *, stream: str = "TENTALIS", subjects=("tentalis.>",)) -> None:
    import nats

    nc = await nats.connect(url)
    try:
        js = nc.jetstream(timeout=30.0)
        try:
            await js.stream_info(stream)
        except Exception:  # noqa: BLE001 - created by the first publisher
            await js.add_stream(name=stream, subjects=list(subjects))
        for subject, body in events:
            data = body if isinstance(body, bytes) else json.dumps(body).encode()
            ack = await js.publish(subject, data)
            assert ack.stream == stream
    finally:
        await nc.close()


async def _pending(url: str, stream: str, durable: str) -> tuple[int, int]:
    """(messages not yet delivered, delivered but not acknowledged) of the durable consumer."""
    import nats

    nc = await nats.connect(url)
    try:
        info = await nc.jetstream(timeout=30.0).consumer_info(stream, durable)
        return info.num_pending, info.num_ack_pending
    finally:
        await nc.close()


def _cfg(server, **kw) -> IngestConfig:
    return IngestConfig(**{"url": server.url, "tenant": "acme", "fetch_timeout": 0.2, "idle_exit": 0.6, "ack_wait": 1.0,
                           "nak_delay": 0.2, **kw})


def test_subjects_map_to_the_three_landings():
    assert subject_kind("tentalis.tasks.assign") == ("assign", None)
    assert subject_kind("tentalis.tasks.result") == ("result", None)
    assert subject_kind("tentalis.feedback") == ("feedback", None)
    assert subject_kind("tasks.coding") == ("assign", "coding")  # the seeds' subjects
    assert subject_kind("results.coding") == ("result", "coding")
    assert subject_kind("feedback.scored") == ("feedback", None)
    assert subject_kind("tentalis.model.updates") == (None, None)
    assert subject_kind("training.rollouts") == (None, None)


def test_events_land_once_and_bad_messages_are_quarantined_and_not_redelivered(server, tmp_path):
    lake = Lakehouse(tmp_path / "lake")
    events = [
        ("tentalis.tasks.assign", {"task_id": "t1", "manager_id": "boss", "task_type": "math", "prompt": "What is 2+3?",
                                   "expected": "5"}),
        ("tentalis.tasks.result", {"task_id": "t1", "worker_id": "w1", "prompt": "What is 2+3?", "status": "success",
                                   "result": "<step>2+3=5</step><answer>5</answer>", "steps": [], "elapsed_seconds": 0.5}),
        ("tentalis.feedback", {"task_id": "t1", "manager_id": "boss", "worker_id": "w1", "score": 0.9,
                               "textual_feedback": "good"}),
        ("tentalis.feedback", b"{not json"),                                            # seq 4: not JSON
        ("tentalis.feedback", {"task_id": "t1", "worker_id": "w1", "score": 9}),         # seq 5: no scale
        ("tentalis.tasks.result", {"task_id": "t-404", "worker_id": "w1", "result": "x", "token": "tok_SECRET_123456"}),
        ("tentalis.model.updates", {"model_version": "v2"}),                            # not ours: skipped
        ("tentalis.tasks.assign", {"task_id": "t1", "manager_id": "boss", "task_type": "math", "prompt": "What is 2+3?",
                                   "expected": "5"}),                                   # a re-sent event
    ]
    asyncio.run(_publish(server.url, events))
    stats = asyncio.run(ingest(lake, _cfg(server)))
    assert stats.as_dict() == {"landed": 3, "unchanged": 1, "rejected": 3, "skipped": 1, "failed": 0, "redelivered": 0,
                               "by_kind": {"assign": 2, "result": 1, "feedback": 1}}
    rid = _hash_id("br", "acme", "t1", "w1")
    assert [(r["task_id"], r["environment"], r["reference"]) for r in lake.read("tasks").to_pylist()] == [("t1", "math", "5")]
    assert [(r["rollout_id"], r["steps"], r["answer"], r["seconds"]) for r in lake.read("rollouts").to_pylist()] == [
        (rid, ["2+3=5"], "5", 0.5)]
    assert [(r["rollout_id"], r["manager"], r["score"], r["critique"]) for r in lake.read("reviews").to_pylist()] == [
        (rid, "boss", 0.9, "good")]
    q = sorted(lake.read("quarantine").to_pylist(), key=lambda r: r["line"])
    assert [(r["source"], r["line"], r["stage"]) for r in q] == [
        ("nats:tentalis.feedback", 4, "bridge"), ("nats:tentalis.feedback", 5, "bridge"), ("nats:tentalis.tasks.result", 6, "bridge")]
    assert q[0]["raw"] == "{not json" and "not JSON" in q[0]["error"]
    assert "'score'" in q[1]["error"] and "'t-404'" in q[2]["error"]
    assert "tok_SECRET_123456" not in q[2]["raw"]
    # Everything was acknowledged or terminated: a second run finds nothing and lands nothing.
    assert asyncio.run(_pending(server.url, "TENTALIS", "tentalis-ingest")) == (0, 0)
    again = asyncio.run(ingest(lake, _cfg(server)))
    assert again.handled == 0 and again.redelivered == 0
    assert lake.read("quarantine").num_rows == 3


class _Crash(Exception):
    pass


def test_a_crash_between_commit_and_ack_redelivers_without_duplicating(server, tmp_path):
    lake = Lakehouse(tmp_path / "lake")
    asyncio.run(_publish(server.url, [
        ("tentalis.tasks.assign", {"task_id": "t1", "prompt": "What is 2+3?", "expected": "5"}),
        ("tentalis.tasks.result", {"task_id": "t1", "worker_id": "w1", "result": "<answer>5</answer>"}),
    ]))

    def crash_on_result(msg, out):
        if msg.subject.endswith("result"):
            raise _Crash  # the process dies after the Delta commit, before the ack

    with pytest.raises(_Crash):
        asyncio.run(ingest(lake, _cfg(server), before_ack=crash_on_result))
    assert lake.read("rollouts").num_rows == 1  # committed
    assert asyncio.run(_pending(server.url, "TENTALIS", "tentalis-ingest")) == (0, 1)  # but not acknowledged
    version = lake.table("rollouts").version()

    # A restarted ingester gets the message again after ack_wait (1 s) and lands nothing new.
    stats = asyncio.run(ingest(lake, _cfg(server, idle_exit=2.5)))
    # (stats.redelivered is JetStream's delivery count as nats-py reports it; it read 0 on a loaded host in
    # some runs although the message came back, so the behaviour is asserted, not the counter.)
    assert (stats.unchanged, stats.landed, stats.by_kind) == (1, 0, {"result": 1})
    assert lake.read("rollouts").num_rows == 1
    assert lake.table("rollouts").version() == version
    assert asyncio.run(_pending(server.url, "TENTALIS", "tentalis-ingest")) == (0, 0)


def test_a_failed_commit_is_not_acked_and_lands_on_redelivery(server, tmp_path, monkeypatch):
    lake = Lakehouse(tmp_path / "lake")
    asyncio.run(_publish(server.url, [("tentalis.tasks.assign", {"task_id": "t1", "prompt": "What is 2+3?"})]))
    real = nats_ingest.LANDERS["assign"]
    calls = []

    def flaky(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise OSError("lakehouse unreachable")
        return real(*args, **kwargs)

    monkeypatch.setitem(nats_ingest.LANDERS, "assign", flaky)
    # ack_wait well above a Delta commit on a loaded machine: only the nak may bring the message back.
    stats = asyncio.run(ingest(lake, _cfg(server, idle_exit=3.0, ack_wait=15.0)))
    # The failed landing was not acked: the message came back (a second landing call) and landed once.
    # (stats.redelivered, from the delivery count JetStream reports, read 0 in 1 of 3 runs on a loaded
    # host although the second call happened: a known miscount, not asserted here.)
    assert (stats.failed, stats.landed, len(calls)) == (1, 1, 2)
    assert [r["task_id"] for r in lake.read("tasks").to_pylist()] == ["t1"]
    assert lake.read("quarantine").num_rows == 0


def test_cli_ingests_the_seeds_subjects(server, tmp_path):
    seeds = ("tasks.>", "results.>", "feedback.>")
    asyncio.run(_publish(server.url, [
        ("tasks.coding", {"task_id": "s1", "manager_id": "m", "task_type": "coding", "prompt": "Write add(a, b)"}),
        ("results.coding", {"task_id": "s1", "worker_id": "w1", "result": "def add(a, b):\n    return a + b", "status": "success"}),
        ("feedback.scored", {"task_id": "s1", "manager_id": "m", "worker_id": "w1", "score": 1.0, "textual_feedback": "ok"}),
    ], stream="SEEDS", subjects=seeds))
    home = tmp_path / "home"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TENTALIS_HOME": str(home)}
    proc = subprocess.run(
        [sys.executable, "-m", "tentalis_pipelines.cli", "ingest-nats", "--url", server.url, "--stream", "SEEDS",
         "--subjects", ",".join(seeds), "--durable", "seeds-ingest", "--tenant", "team-a", "--max-messages", "3"],
        capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.strip().splitlines()[-1])["landed"] == 3
    lake = Lakehouse(home / "lakehouse")
    (task,) = lake.read("tasks").to_pylist()
    assert (task["task_id"], task["environment"], json.loads(task["metadata"])["tenant"]) == ("s1", "code", "team-a")
    assert task["batch_id"].startswith("bridge-team_a_")
    (review,) = lake.read("reviews").to_pylist()
    assert (review["rollout_id"], review["score"]) == (_hash_id("br", "team-a", "s1", "w1"), 1.0)
