"""`tentalis reward-server`'s promises beyond the contract's answer (rewards/reward_server.py's docstring):
the audit log's record of each sample, whole and in UTC, with a reason only where a sample was not
scored (and a warning for it); no log without a log path; the body limit at its exact edge; a pool the
app made is started and closed with it, one it was given is left running. Written from the mutmut
target ``reward_server``'s survivors (tools/mutants/reports/reward_server.md)."""

from __future__ import annotations

import json
import logging
import multiprocessing as mp
from datetime import datetime, timedelta, timezone

import pytest
from fastapi.testclient import TestClient

from tentalis_pipelines.rewards import remote_reward as rr
from tentalis_pipelines.rewards import reward_server
from tentalis_pipelines.rewards.score_pool import ScoringPool

PROMPT = "<|im_start|>user\nTom has 12 marbles and finds 7 more. How many marbles does he have?<|im_end|>\n<|im_start|>assistant\n"
RIGHT = PROMPT + "<step>12 + 7 = 19</step>\n<answer>19</answer><|im_end|>"
UNTAGGED = PROMPT + "He has 19 marbles.<|im_end|>"
# Past the scorer's reading limit: reward 0 with its reason, from the real scorer (no deadline to wait on).
TOO_LONG = "x" * (rr.MAX_QUERY_CHARS + 1)
LOGGED = {"at", "prompt", "query", "label", "reward", "outcome", "format", "process", "manager", "answer"}


@pytest.fixture(scope="module")
def pool():
    """One started scoring worker for the module's apps."""
    p = ScoringPool(workers=1)
    p.start()
    yield p
    p.close()


def _workers() -> set[int]:
    return {p.pid for p in mp.active_children() if p.name == "tentalis-reward-worker"}


def test_the_log_records_every_sample_whole_in_utc_with_a_reason_only_where_it_was_not_scored(tmp_path, pool, caplog):
    log = tmp_path / "runs" / "7" / "rewards.jsonl"  # two folders that do not exist yet
    client = TestClient(reward_server.create_app(log, pool=pool))
    body = {"query": [RIGHT, TOO_LONG, UNTAGGED], "prompts": [PROMPT] * 3, "labels": ["19", "19", "19"]}
    before = datetime.now(timezone.utc)
    with caplog.at_level(logging.WARNING, logger=reward_server.__name__):
        answer = client.post("/get_reward", json=body).json()
    after = datetime.now(timezone.utc)
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert [set(r) for r in lines] == [LOGGED, LOGGED | {"reason"}, LOGGED]
    reason = lines[1]["reason"]
    assert reason.startswith(f"query or prompt of {rr.MAX_QUERY_CHARS + 1} characters")
    extra = answer["extra_logs"]
    for i, r in enumerate(lines):
        assert (r["prompt"], r["query"], r["label"]) == (PROMPT, body["query"][i], "19")
        assert r["reward"] == answer["rewards"][i] and r["outcome"] == answer["scores"][i] == extra["outcome"][i]
        assert r["format"] == extra["format"][i] and r["manager"] == extra["manager"][i]
        at = datetime.fromisoformat(r["at"])
        assert at.utcoffset() == timedelta(0) and before <= at <= after
    # The log keeps what the contract's numbers cannot: no checkable step is None (the answer says 0).
    assert [r["process"] for r in lines] == [1.0, None, None] and extra["process"] == [1.0, 0.0, 0.0]
    assert [r["answer"] for r in lines] == ["19", None, "19"] and answer["rewards"][1] == 0.0
    warned = [rec.getMessage() for rec in caplog.records if rec.name == reward_server.__name__]
    assert warned == [f"sample 1 of a request scored 0: {reason}"]


def test_without_a_log_path_nothing_is_written(tmp_path, monkeypatch, pool):
    monkeypatch.chdir(tmp_path)
    app = reward_server.create_app(None, pool=pool)
    assert app.state.pool is pool
    answer = TestClient(app).post("/", json={"query": [RIGHT], "prompts": [PROMPT], "labels": ["19"]}).json()
    assert answer["rewards"] == [pytest.approx(1.9)]
    assert list(tmp_path.iterdir()) == []


def test_a_body_of_exactly_the_limit_is_scored_and_one_byte_more_is_refused(monkeypatch, pool):
    client = TestClient(reward_server.create_app(None, pool=pool))
    raw = json.dumps({"query": [RIGHT], "prompts": [PROMPT], "labels": ["19"]}).encode()
    headers = {"content-type": "application/json"}
    monkeypatch.setattr(reward_server, "MAX_BODY_BYTES", len(raw))
    r = client.post("/get_reward", content=raw, headers=headers)
    assert r.status_code == 200 and r.json()["rewards"] == [pytest.approx(1.9)]
    monkeypatch.setattr(reward_server, "MAX_BODY_BYTES", len(raw) - 1)
    r = client.post("/get_reward", content=raw, headers=headers)
    assert r.status_code == 413 and f"the body has {len(raw)} bytes; at most {len(raw) - 1}" in r.json()["error"]


def test_a_pool_the_app_made_starts_with_it_and_closes_with_it():
    app = reward_server.create_app(None, workers=1, sample_seconds=2.5)
    made = app.state.pool
    assert isinstance(made, ScoringPool) and (made.workers, made.sample_seconds) == (1, 2.5)
    before = _workers()
    with TestClient(app) as client:
        started = _workers() - before  # at startup, before any request
        assert len(started) == 1
        assert client.post("/", json={"query": [RIGHT], "prompts": [PROMPT], "labels": ["19"]}).json()["rewards"] == [pytest.approx(1.9)]
    assert not started & _workers()


def test_a_pool_the_app_was_given_is_left_running(pool):
    running = _workers()
    assert running
    with TestClient(reward_server.create_app(None, pool=pool)) as client:
        assert client.post("/", json={"query": [RIGHT], "prompts": [PROMPT], "labels": ["19"]}).status_code == 200
    assert running <= _workers()


def test_the_api_page_names_the_server_and_its_contract(pool):
    info = TestClient(reward_server.create_app(None, pool=pool)).get("/openapi.json").json()["info"]
    assert info["title"] == "Tentalis reward server (OpenRLHF remote reward contract)"
