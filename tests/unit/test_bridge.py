"""The Bridge landing functions: rows, ids, idempotent re-sends, refusals that name the field, quarantine."""

from __future__ import annotations

import hashlib
import json
from datetime import datetime, timezone

import pytest

from tentalis_pipelines.gateway import bridge
from tentalis_pipelines.gateway.bridge import (
    BridgeInputError,
    bridge_batch_id,
    bridge_status,
    land_feedback,
    land_task_assign,
    land_task_result,
    tenant_slug,
)
from tentalis_pipelines.lakehouse import Lakehouse

DAY1 = datetime(2025, 3, 4, 23, 59, tzinfo=timezone.utc)
DAY2 = datetime(2025, 3, 5, 0, 1, tzinfo=timezone.utc)


def _hash_id(kind: str, *parts) -> str:
    """The id the Bridge derives, computed here by hand: sha256 of the JSON list [kind, *parts], 20 hex digits."""
    return f"{kind}-{hashlib.sha256(json.dumps([kind, *parts], sort_keys=True).encode()).hexdigest()[:20]}"


@pytest.fixture()
def lake(tmp_path, monkeypatch) -> Lakehouse:
    clock = {"now": DAY1}
    monkeypatch.setattr(bridge, "now_utc", lambda: clock["now"])
    lake = Lakehouse(tmp_path / "lake")
    lake.clock = clock  # tests move the Bridge's clock with lake.clock["now"] = ...
    return lake


def _version(lake: Lakehouse, name: str) -> int | None:
    dt = lake.table(name)
    return None if dt is None else dt.version()


def _quarantine(lake: Lakehouse) -> list[dict]:
    return sorted(lake.read("quarantine").to_pylist(), key=lambda r: r["seen_at"])


ASSIGN = {"prompt": "What is 2+3?", "expected": "5", "worker_id": "w1", "manager_id": "boss", "task_type": "math"}


def test_assign_lands_one_task_row_and_a_resend_changes_nothing(lake):
    out = land_task_assign(lake, dict(ASSIGN), "acme")
    task_id = _hash_id("bt", "acme", "w1", "boss", "What is 2+3?", "5")
    assert out == {"task_id": task_id, "batch_id": "bridge-acme-20250304", "tenant": "acme", "tenant_slug": "acme",
                   "status": "created"}
    rows = lake.read("tasks").to_pylist()
    assert len(rows) == 1
    row = rows[0]
    assert {k: row[k] for k in ("batch_id", "task_id", "source", "environment", "prompt", "reference", "difficulty")} == {
        "batch_id": "bridge-acme-20250304", "task_id": task_id, "source": "bridge", "environment": "math",
        "prompt": "What is 2+3?", "reference": "5", "difficulty": None}
    assert json.loads(row["metadata"]) == {"tenant": "acme", "worker_id": "w1", "manager_id": "boss", "task_type": "math"}
    assert row["created_at"] == DAY1
    assert lake.table("tasks").metadata().partition_columns == ["batch_id"]
    version = _version(lake, "tasks")

    # The same event again, a day later: same id, same partition, no commit at all.
    lake.clock["now"] = DAY2
    assert land_task_assign(lake, dict(ASSIGN), "acme")["status"] == "unchanged"
    assert _version(lake, "tasks") == version
    assert lake.read("tasks").num_rows == 1

    # A changed event for the same task id updates the row in its first partition (the latest wins).
    out = land_task_assign(lake, {**ASSIGN, "task_id": task_id, "expected": "five"}, "acme")
    assert (out["status"], out["batch_id"]) == ("updated", "bridge-acme-20250304")
    assert [(r["task_id"], r["reference"], r["created_at"]) for r in lake.read("tasks").to_pylist()] == [(task_id, "five", DAY1)]

    # A new task on day 2 lands in day 2's partition; the environment defaults to chat.
    out = land_task_assign(lake, {"task_id": "t-2", "prompt": "Say hi"}, "acme")
    assert out["batch_id"] == "bridge-acme-20250305"
    assert lake.read("tasks", batch_id="bridge-acme-20250305").to_pylist()[0]["environment"] == "chat"


def _assigned(lake, task_id="t1", tenant="acme", prompt="What is 2+3?"):
    return land_task_assign(lake, {"task_id": task_id, "prompt": prompt, "expected": "5"}, tenant)


def test_result_lands_one_rollout_per_worker_with_parsed_steps(lake):
    _assigned(lake)
    lake.clock["now"] = DAY2  # results come the next day: they land beside their task
    text = "<step>2 plus 3</step><step>is 5</step><answer>5</answer>"
    out = land_task_result(lake, {"task_id": "t1", "worker_id": "w1", "result": text, "elapsed_seconds": 1.5}, "acme")
    rid = _hash_id("br", "acme", "t1", "w1")
    assert out == {"task_id": "t1", "rollout_id": rid, "batch_id": "bridge-acme-20250304", "group_index": 0,
                   "worker_id": "w1", "status": "created"}
    row = lake.read("rollouts").to_pylist()[0]
    expected = {"batch_id": "bridge-acme-20250304", "rollout_id": rid, "task_id": "t1", "group_index": 0,
                "policy_version": "external:w1", "backend": "bridge", "model": "external:w1", "prompt_text": "What is 2+3?",
                "completion": text, "steps": ["2 plus 3", "is 5"], "answer": "5", "parse_mode": "tagged", "prompt_tokens": 0,
                "completion_tokens": 0, "completion_token_ids": [], "sampling_logprobs": None, "finish_reason": "stop",
                "temperature": 1.0, "seconds": 1.5, "created_at": DAY2,
                # live-session columns (tentalis serve): empty for a Bridge result
                "session_id": None, "prompt_token_ids": None, "assistant_mask": None, "turn_spans": None,
                "skill_ids": None,  # no prompt of ours: no skills injected
                "episode": None}  # not an agent episode
    assert row == expected
    version = _version(lake, "rollouts")
    assert land_task_result(lake, {"task_id": "t1", "worker_id": "w1", "result": text, "elapsed_seconds": 1.5}, "acme")["status"] == "unchanged"
    assert _version(lake, "rollouts") == version

    # A second worker: the next group index; given steps and answer win over parsing; seeds' model_version.
    out = land_task_result(lake, {"task_id": "t1", "worker_id": "w2", "result": "it is 6", "steps": ["guess"], "answer": "6",
                                  "status": "failed", "model_version": "ckpt-7"}, "acme")
    assert out["group_index"] == 1
    w2 = [r for r in lake.read("rollouts").to_pylist() if r["rollout_id"] == out["rollout_id"]][0]
    assert (w2["steps"], w2["answer"], w2["parse_mode"], w2["finish_reason"], w2["policy_version"]) == (
        ["guess"], "6", "fallback", "error", "ckpt-7")
    # Without tags the step parser falls back to lines and the last number.
    land_task_result(lake, {"task_id": "t1", "worker_id": "w1", "result": "2+3\nso 5"}, "acme")
    w1 = [r for r in lake.read("rollouts").to_pylist() if r["rollout_id"] == rid][0]
    assert (w1["steps"], w1["answer"], w1["parse_mode"], w1["group_index"], w1["created_at"]) == (["2+3", "so 5"], "5", "fallback", 0, DAY2)
    assert lake.read("rollouts").num_rows == 2


def test_feedback_lands_a_review_on_the_workers_rollout(lake):
    _assigned(lake)
    land_task_result(lake, {"task_id": "t1", "worker_id": "w1", "result": "<answer>5</answer>"}, "acme")
    fb = {"task_id": "t1", "manager_id": "boss", "worker_id": "w1", "score": 0.75, "textual_feedback": "right, but show steps",
          "hint": "write each step in <step> tags"}
    out = land_feedback(lake, dict(fb), "acme")
    rid = _hash_id("br", "acme", "t1", "w1")
    assert out == {"task_id": "t1", "rollout_id": rid, "batch_id": "bridge-acme-20250304", "score": 0.75, "status": "created"}
    assert lake.read("reviews").to_pylist() == [{"batch_id": "bridge-acme-20250304", "rollout_id": rid, "manager": "boss",
                                                 "score": 0.75, "critique": "right, but show steps",
                                                 "hint": "write each step in <step> tags", "created_at": DAY1,
                                                 "review_id": None, "session_id": None, "reviewer": "boss", "rubric": None,
                                                 "tenant": "acme"}]
    version = _version(lake, "reviews")
    assert land_feedback(lake, dict(fb), "acme")["status"] == "unchanged"
    assert _version(lake, "reviews") == version
    # Scales the payload declares; one review per rollout (the latest wins). worker_id may be left out
    # when the task has one result.
    assert land_feedback(lake, {"task_id": "t1", "score": 8, "scale": 10, "critique": "better"}, "acme")["score"] == 0.8
    assert land_feedback(lake, {"task_id": "t1", "score": 40, "scale": 100}, "acme")["score"] == 0.4
    assert [(r["score"], r["manager"], r["critique"]) for r in lake.read("reviews").to_pylist()] == [(0.4, "manager", "")]


@pytest.mark.parametrize(("payload", "field", "words"), [
    ({"task_id": "t1", "worker_id": "w1", "score": 8}, "score", ["8", "outside [0, 1]", '"scale": 10']),
    ({"task_id": "t1", "worker_id": "w1", "score": 120, "scale": 100}, "score", ["120", "[0, 100]"]),
    ({"task_id": "t1", "worker_id": "w1", "score": -0.1}, "score", ["-0.1"]),
    ({"task_id": "t1", "worker_id": "w1", "score": "high"}, "score", ["finite number"]),
    ({"task_id": "t1", "worker_id": "w1", "score": 0.5, "scale": 5}, "scale", ["10 or 100"]),
    ({"task_id": "t1", "worker_id": "w1"}, "score", ["missing"]),
    ({"task_id": "t1", "worker_id": "w9", "score": 0.5}, "worker_id", ["'w9'", "no result"]),
    ({"task_id": "t1", "rollout_id": "br-nope", "score": 0.5}, "rollout_id", ["'br-nope'"]),
    ({"task_id": "t-unknown", "score": 0.5}, "task_id", ["'t-unknown'", "unknown task_id"]),
])
def test_bad_feedback_is_refused_naming_the_field_and_quarantined(lake, payload, field, words):
    _assigned(lake)
    land_task_result(lake, {"task_id": "t1", "worker_id": "w1", "result": "5"}, "acme")
    land_feedback(lake, {"task_id": "t1", "worker_id": "w1", "score": 1.0}, "acme")
    before = lake.read("reviews").to_pylist()
    with pytest.raises(BridgeInputError) as info:
        land_feedback(lake, dict(payload), "acme")
    assert info.value.field == field
    for word in words:
        assert word in str(info.value)
    assert lake.read("reviews").to_pylist() == before  # nothing stored is lost or changed
    q = _quarantine(lake)
    assert len(q) == 1
    assert (q[0]["source"], q[0]["stage"], q[0]["batch_id"], q[0]["error"]) == (
        "bridge:feedback", "bridge", "bridge-acme-20250304", str(info.value))
    assert json.loads(q[0]["raw"]) == payload


def test_unknown_task_result_is_refused_and_quarantined_without_secrets(lake):
    _assigned(lake)
    land_task_result(lake, {"task_id": "t1", "worker_id": "w1", "result": "5"}, "acme")
    before = lake.read("rollouts").to_pylist()
    payload = {"task_id": "t-404", "worker_id": "w1", "result": "5", "api_key": "sk-live-0123456789abcdef",
               "headers": {"Authorization": "Bearer tok_ABCDEFGH12345678"}}
    with pytest.raises(BridgeInputError, match="unknown task_id 't-404'") as info:
        land_task_result(lake, payload, "acme")
    assert info.value.field == "task_id"
    assert lake.read("rollouts").to_pylist() == before
    (q,) = _quarantine(lake)
    assert q["source"] == "bridge:result"
    assert "sk-live-0123456789abcdef" not in q["raw"] and "tok_ABCDEFGH12345678" not in q["raw"]
    assert '"task_id": "t-404"' in q["raw"] and "***" in q["raw"]


@pytest.mark.parametrize(("fn", "payload", "field"), [
    (land_task_assign, {"expected": "5"}, "prompt"),
    (land_task_assign, {"prompt": "  "}, "prompt"),
    (land_task_assign, {"prompt": "x", "environment": "poetry"}, "environment"),
    (land_task_assign, {"prompt": "x", "metadata": ["a"]}, "metadata"),
    (land_task_assign, {"prompt": "x", "task_id": ["t"]}, "task_id"),
    (land_task_result, {"worker_id": "w1", "result": "5"}, "task_id"),
    (land_task_result, {"task_id": "t1", "result": "5"}, "worker_id"),
    (land_task_result, {"task_id": "t1", "worker_id": "w1"}, "result"),
    (land_task_result, {"task_id": "t1", "worker_id": "w1", "result": "5", "steps": "one"}, "steps"),
    (land_task_result, {"task_id": "t1", "worker_id": "w1", "result": "5", "status": "maybe"}, "status"),
    (land_task_result, {"task_id": "t1", "worker_id": "w1", "result": "5", "elapsed_seconds": -1}, "elapsed_seconds"),
    (land_task_result, "not an object", "payload"),
])
def test_bad_payloads_name_their_field(lake, fn, payload, field):
    _assigned(lake)
    before = {t: lake.read(t).to_pylist() for t in ("tasks", "rollouts")}
    with pytest.raises(BridgeInputError) as info:
        fn(lake, payload, "acme")
    assert info.value.field == field
    assert repr(field) in str(info.value) or field == "payload"
    assert {t: lake.read(t).to_pylist() for t in ("tasks", "rollouts")} == before
    assert len(_quarantine(lake)) == 1


def test_feedback_needs_a_worker_when_a_task_has_several_results(lake):
    _assigned(lake)
    with pytest.raises(BridgeInputError, match="no result yet") as info:
        land_feedback(lake, {"task_id": "t1", "score": 0.5}, "acme")
    assert info.value.field == "worker_id"
    for w in ("w1", "w2"):
        land_task_result(lake, {"task_id": "t1", "worker_id": w, "result": "5"}, "acme")
    with pytest.raises(BridgeInputError, match="2 results") as info:
        land_feedback(lake, {"task_id": "t1", "score": 0.5}, "acme")
    assert info.value.field == "worker_id"
    out = land_feedback(lake, {"task_id": "t1", "rollout_id": _hash_id("br", "acme", "t1", "w2"), "score": 0.5}, "acme")
    assert out["rollout_id"] == _hash_id("br", "acme", "t1", "w2")


def test_tenants_are_apart(lake):
    assert tenant_slug("acme") == "acme"
    assert tenant_slug("a-b") == f"a_b_{hashlib.sha256(b'a-b').hexdigest()[:8]}"
    assert tenant_slug("a_b") != tenant_slug("a-b")
    assert bridge_batch_id("a-b", DAY1) == f"bridge-a_b_{hashlib.sha256(b'a-b').hexdigest()[:8]}-20250304"
    with pytest.raises(BridgeInputError, match="tenant"):
        tenant_slug("")
    _assigned(lake, tenant="acme")
    # The same task id under another tenant is another task; acme's task is unknown to it.
    with pytest.raises(BridgeInputError, match="unknown task_id 't1'"):
        land_task_result(lake, {"task_id": "t1", "worker_id": "w1", "result": "5"}, "acme-2")
    _assigned(lake, tenant="acme-2", prompt="What is 1+1?")
    land_task_result(lake, {"task_id": "t1", "worker_id": "w1", "result": "2"}, "acme-2")
    assert bridge_status(lake, "acme")["resulted"] == 0
    assert bridge_status(lake, "acme-2")["resulted"] == 1
    assert lake.read("tasks").num_rows == 2


def test_status_counts_a_tenants_tasks(lake):
    for t in ("A", "B", "C"):
        _assigned(lake, task_id=t)
    _assigned(lake, task_id="X", tenant="other")
    for t, w in (("A", "w1"), ("A", "w2"), ("B", "w1")):
        land_task_result(lake, {"task_id": t, "worker_id": w, "result": "5"}, "acme")
    land_feedback(lake, {"task_id": "A", "worker_id": "w1", "score": 1}, "acme")
    # A: two results, one reviewed; B: a result, no review; C: nothing yet.
    assert bridge_status(lake, "acme") == {
        "tenant": "acme", "assigned": 3, "resulted": 2, "reviewed": 1, "pending_results": 1, "pending_reviews": 2,
        "pending": 3, "rollouts": 3, "reviews": 1, "batches": ["bridge-acme-20250304"]}
    assert bridge_status(lake, "nobody")["assigned"] == 0
    one = bridge_status(lake, "acme", task_id="A")
    assert (one["state"], [r["review"]["score"] if r["review"] else None for r in one["results"]]) == ("reviewed", [1.0, None])
    assert bridge_status(lake, "acme", task_id="C")["state"] == "pending"
    with pytest.raises(BridgeInputError, match="'nope'"):
        bridge_status(lake, "acme", task_id="nope")
    assert lake.read("quarantine").num_rows == 0  # a status query for an unknown id is not bad input to keep


def test_ids_with_quotes_and_unicode_land_and_resend_once(lake):
    for task_id in ("it's", "t\u00e9st \u4efb\u52a1"):
        land_task_assign(lake, {"task_id": task_id, "prompt": "p"}, "acme")
        land_task_result(lake, {"task_id": task_id, "worker_id": "o'neil", "result": "1"}, "acme")
        out = land_feedback(lake, {"task_id": task_id, "worker_id": "o'neil", "score": 0.5}, "acme")
        assert out["rollout_id"] == _hash_id("br", "acme", task_id, "o'neil")
        assert land_task_result(lake, {"task_id": task_id, "worker_id": "o'neil", "result": "1"}, "acme")["status"] == "unchanged"
    assert (lake.read("tasks").num_rows, lake.read("rollouts").num_rows, lake.read("reviews").num_rows) == (2, 2, 2)
