"""`tentalis reward-server`'s app in this process (FastAPI's test client, no socket; scoring in one worker
process): OpenRLHF's request shapes scored by hand, each sample scored against its own label, refusals
with their status and nothing logged, a sample past its deadline, and the contract's parsing at its edges."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient

from tentalis_pipelines.rewards import remote_reward as rr
from tentalis_pipelines.rewards import reward_server
from tentalis_pipelines.rewards.score_pool import ScoringPool

PROMPT = "<|im_start|>user\nTom has 12 marbles and finds 7 more. How many marbles does he have?<|im_end|>\n<|im_start|>assistant\n"
RIGHT = PROMPT + "<step>12 + 7 = 19</step>\n<answer>19</answer><|im_end|>"
UNTAGGED = PROMPT + "He has 19 marbles.<|im_end|>"


@pytest.fixture(scope="module")
def pool():
    """One scoring worker for the module's apps (a worker's start and warm-up cost about a second)."""
    p = ScoringPool(workers=1)
    yield p
    p.close()


def _lines(log) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def test_a_batch_is_scored_sample_by_sample_against_its_own_label_and_logged(tmp_path, pool):
    log = tmp_path / "logs" / "rewards.jsonl"
    client = TestClient(reward_server.create_app(log, pool=pool))
    # Three samples, three labels (no order of them scores the same): RIGHT against 20 (wrong answer but
    # tagged, its step right; the verifier manager gives a tagged wrong answer 0.1: 0 + 0.2 * 1 + 0.2 * 1 +
    # 0.5 * 0.1 = 0.45), RIGHT against 19 (1.9 by hand, see test_launcher_contracts), UNTAGGED against 19
    # (right but untagged: 1 + 0 + 0 + 0.5 * 0.7 = 1.35).
    body = {"query": [RIGHT, RIGHT, UNTAGGED], "prompts": [PROMPT] * 3, "labels": ["20", "19", 19]}
    answer = client.post("/", json=body).json()
    assert answer["rewards"] == [pytest.approx(0.45), pytest.approx(1.9), pytest.approx(1.35)]
    assert answer["scores"] == [0.0, 1.0, 1.0]  # the outcome alone, in [0, 1]
    # No checkable step in UNTAGGED: process logged as 0 beside checked_steps 0 (OpenRLHF logs numbers only).
    assert answer["extra_logs"]["process"] == [1.0, 1.0, 0.0] and answer["extra_logs"]["checked_steps"] == [1.0, 1.0, 0.0]
    logged = _lines(log)
    assert [(r["label"], r["prompt"], r["query"], r["answer"]) for r in logged] == [
        ("20", PROMPT, RIGHT, "19"), ("19", PROMPT, RIGHT, "19"), (19, PROMPT, UNTAGGED, "19")]
    assert client.post("/get_reward", json={"query": [RIGHT], "prompts": [PROMPT], "labels": ["19"]}).json()["rewards"] == [pytest.approx(1.9)]
    assert len(_lines(log)) == 4 and client.get("/health").json() == {"ok": True}


def test_refused_requests_get_their_status_and_are_not_logged(tmp_path, monkeypatch, pool):
    log = tmp_path / "rewards.jsonl"
    client = TestClient(reward_server.create_app(log, pool=pool))
    r = client.post("/get_reward", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 400 and "not JSON" in r.json()["error"]
    # The bodies that gave 500s (issue 73): JSON nested past the recursion limit, a 5,000-digit number.
    r = client.post("/get_reward", content=b"[" * 50_000 + b"]" * 50_000)
    assert r.status_code == 400 and "nested too deeply" in r.json()["error"]
    r = client.post("/get_reward", content=b'{"query": ["q"], "prompts": ["p"], "labels": [' + b"9" * 5000 + b"]}")
    assert r.status_code == 400 and "send long labels as strings" in r.json()["error"]
    r = client.post("/get_reward", json={"query": [RIGHT], "prompts": [PROMPT], "labels": [""]})
    assert r.status_code == 422 and "'labels[0]' must be a non-empty answer" in r.json()["error"]
    monkeypatch.setattr(reward_server, "MAX_BODY_BYTES", 100)
    r = client.post("/get_reward", json={"query": [RIGHT], "prompts": [PROMPT], "labels": ["19"]})
    assert r.status_code == 413 and "at most 100" in r.json()["error"]
    assert _lines(log) == []


def test_the_contract_at_its_edges():
    n = rr.MAX_QUERIES
    assert len(rr.parse_request({"query": ["q"] * n, "prompts": ["p"] * n, "labels": ["1"] * n})[0]) == n  # exactly the limit
    cases = [({"query": ["a", "b"], "prompts": ["p"], "labels": ["1", "2"]}, "one entry per sample: got 2, 1 and 2"),
             ({"query": ["a"], "prompts": ["p"], "labels": ["1"], "response": ["x"]}, "unknown fields ['response']"),
             ({"query": ["a"], "prompts": ["p"], "labels": ["   "]}, "'labels[0]' must be a non-empty answer"),
             ({"query": ["a"], "prompts": ["p"], "labels": ["1" * (rr.MAX_LABEL_CHARS + 1)]}, "'labels[0]' must be a non-empty answer")]
    for body, says in cases:
        with pytest.raises(rr.RewardRequestError) as err:
            rr.parse_request(body)
        assert says in str(err.value), (body, str(err.value))


def test_a_sample_past_the_deadline_scores_zero_with_its_reason_and_the_rest_are_scored(tmp_path):
    """The deadline's backstop, with a stand-in scorer that hangs on SLEEP and kills its worker on CRASH:
    each such sample gets reward 0 with its reason (answered and logged), the worker is replaced, and
    the request's other samples, before and after, are scored by the real scorer."""
    log = tmp_path / "rewards.jsonl"
    slow = ScoringPool(workers=1, sample_seconds=1.0, scorer="tests.slow_scorer:score_query")
    try:
        with TestClient(reward_server.create_app(log, pool=slow)) as client:
            body = {"query": [RIGHT, "SLEEP" + RIGHT, RIGHT, "CRASH", RIGHT], "prompts": [PROMPT] * 5, "labels": ["19"] * 5}
            answer = client.post("/get_reward", json=body).json()
            assert answer["rewards"] == [pytest.approx(1.9), 0.0, pytest.approx(1.9), 0.0, pytest.approx(1.9)]
            assert answer["scores"] == [1.0, 0.0, 1.0, 0.0, 1.0]
            reasons = [r.get("reason") for r in _lines(log)]
            assert reasons == [None, "not scored within 1 s", None, "its scorer died", None]
            # The replacement worker takes the next request as usual.
            assert client.post("/", json={"query": [RIGHT], "prompts": [PROMPT], "labels": ["19"]}).json()["rewards"] == [pytest.approx(1.9)]
    finally:
        slow.close()
