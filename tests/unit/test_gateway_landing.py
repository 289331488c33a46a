"""The gateway's landing (issue #33): every sampling setting a turn was answered with is sent upstream
and recorded as used (non-default temperatures, max_completion_tokens over max_tokens, the stream flag),
and the session rows are recomputed from turns with several choices, policies and landings. The
upstream is a function in the test (no model, no server, no subprocess). Each test names the planted
bug it was seen failing against (tools/mutants/catalog/landing.py)."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from fastapi.testclient import TestClient

from tentalis_pipelines.gateway import landing
from tentalis_pipelines.gateway.app import GatewayConfig, create_app
from tentalis_pipelines.lakehouse import Lakehouse, now_utc

MESSAGES = [{"role": "user", "content": "What is 2 + 2?"}]


@pytest.fixture
def gateway(tmp_path):
    cfg = GatewayConfig(home=tmp_path, lakehouse=tmp_path / "lake", upstream="http://127.0.0.1:9", model_name="served", no_auth=True,
                        flush_interval=60.0)
    with TestClient(create_app(cfg)) as client:
        gw = client.app.state.gateway
        sent: list[tuple[str, dict]] = []

        async def post(path, body):
            sent.append((path, body))
            return {"id": f"up-{len(sent)}", "choices": [
                {"index": 0, "message": {"role": "assistant", "content": "4"}, "finish_reason": "stop",
                 "logprobs": {"content": [{"token": "4", "logprob": -0.25}]}},
                {"index": 1, "message": {"role": "assistant", "content": "four"}, "finish_reason": "length"}]}

        async def stream(path, body):
            sent.append((path, body))
            for chunk in ({"id": "up-2", "choices": [{"index": 0, "delta": {"content": "fo"}}]},
                          {"id": "up-2", "choices": [{"index": 0, "delta": {"content": "ur"}, "finish_reason": "stop"}]}):
                yield chunk
            yield None

        gw.upstream.post, gw.upstream.stream = post, stream
        yield client, gw, sent


def _turns(gw) -> list[dict]:
    gw.flusher.flush()
    return sorted(Lakehouse(gw.cfg.lakehouse).read("turns").to_pylist(), key=lambda r: (r["turn_index"], r["choice_index"]))


def test_the_sampling_settings_are_sent_and_recorded_as_used(gateway):
    """Mutants landing-temperature-default, landing-max-tokens-ignores-completion-tokens,
    landing-payload-drops-defaults: temperature 0.3 and max_completion_tokens 12 (over max_tokens 50) are
    recorded; a request that leaves temperature out is sent temperature 1.0 explicitly (an upstream's own
    default, e.g. a generation_config's 0.6, would otherwise be used while 1.0 is recorded)."""
    client, gw, sent = gateway
    r = client.post("/v1/chat/completions", headers={"X-Session-Id": "s1"},
                    json={"model": "served", "messages": MESSAGES, "temperature": 0.3, "top_p": 0.9, "seed": 7, "stop": ["\n"],
                          "max_tokens": 50, "max_completion_tokens": 12, "n": 2})
    assert r.status_code == 200, r.text
    body = sent[-1][1]
    assert (body["temperature"], body["top_p"], body["seed"], body["stop"], body["n"], body["max_completion_tokens"]) == (0.3, 0.9, 7, ["\n"], 2, 12)
    r = client.post("/v1/chat/completions", headers={"X-Session-Id": "s1"}, json={"model": "tentalis", "messages": MESSAGES})
    assert r.status_code == 200, r.text
    body = sent[-1][1]
    assert (body["model"], body["temperature"], body["top_p"], body["n"]) == ("served", 1.0, 1.0, 1) and "max_tokens" not in body
    turns = _turns(gw)
    assert [(t["turn_index"], t["choice_index"], t["temperature"], t["max_tokens"], t["stream"], t["finish_reason"]) for t in turns] == [
        (0, 0, 0.3, 12, False, "stop"), (0, 1, 0.3, 12, False, "length"), (1, 0, 1.0, None, False, "stop"), (1, 1, 1.0, None, False, "length")]
    assert turns[0]["sampling_logprobs"] == [-0.25] and turns[1]["sampling_logprobs"] is None
    assert json.loads(turns[1]["response"])["content"] == "four"


def test_a_streamed_turn_is_recorded_as_streamed(gateway):
    """Mutant landing-stream-flag: a streamed answer lands with stream = true and its joined text."""
    client, gw, _ = gateway
    r = client.post("/v1/chat/completions", headers={"X-Session-Id": "s2"},
                    json={"model": "served", "messages": MESSAGES, "stream": True, "temperature": 1.4, "max_tokens": 9})
    assert r.status_code == 200 and "[DONE]" in r.text
    (t,) = _turns(gw)
    assert (t["stream"], t["temperature"], t["max_tokens"], t["turn_id"]) == (True, 1.4, 9, "up-2-0")
    assert json.loads(t["response"])["content"] == "four"


# --------------------------------------------------------------------------- the session rows
T0 = now_utc() - timedelta(hours=1)


def _rec(sid: str, index: int, choice: int, version: str, minute: int, metadata: str | None = None) -> dict:
    row = {"turn_id": f"{sid}-t{index}-{choice}", "session_id": sid, "tenant": "acme", "turn_index": index, "choice_index": choice,
           "endpoint": "chat.completions", "model": f"m-{version}", "policy_version": version, "messages": "[]", "response": "{}",
           "temperature": 0.7, "created_at": (T0 + timedelta(minutes=minute)).isoformat()}
    return {"kind": "turn", "row": row, "session_metadata": metadata}


def test_session_rows_count_turns_not_choices_and_keep_the_policies_in_order(tmp_path):
    """Mutants landing-count-choices, landing-versions-sorted, landing-first-last-swapped,
    landing-duplicate-turns, landing-metadata-stale: a session whose first turn has two choices, served
    by ckpt-b and then ckpt-a, landed twice, with new metadata on the second landing."""
    lake = Lakehouse(tmp_path / "lake")
    first = [_rec("s1", 0, 0, "ckpt-b", 1, '{"v": 1}'), _rec("s1", 0, 1, "ckpt-b", 1, '{"v": 1}'), _rec("s2", 0, 0, "base", 2)]
    assert landing.land_records(lake, first) == {"turns": 3, "sessions": 2}
    again = first + [_rec("s1", 1, 0, "ckpt-a", 5, '{"v": 2}'), _rec("s1", 2, 0, "ckpt-b", 9, '{"v": 2}')]
    assert landing.land_records(lake, again) == {"turns": 2, "sessions": 2}
    assert lake.read("turns").num_rows == 5
    rows = {r["session_id"]: r for r in lake.read("sessions").to_pylist()}
    s1 = rows["s1"]
    assert (s1["turn_count"], s1["policy_versions"], s1["models"]) == (3, ["ckpt-b", "ckpt-a"], ["m-ckpt-b", "m-ckpt-a"])
    assert (s1["first_turn_at"], s1["last_turn_at"]) == (T0 + timedelta(minutes=1), T0 + timedelta(minutes=9))
    assert s1["metadata"] == '{"v": 2}' and rows["s2"]["metadata"] == "{}" and rows["s2"]["turn_count"] == 1
    # Landed again without metadata: the session keeps its last.
    landing.land_records(lake, [_rec("s1", 3, 0, "ckpt-a", 12)])
    (s1,) = [r for r in lake.read("sessions").to_pylist() if r["session_id"] == "s1"]
    assert (s1["turn_count"], s1["metadata"]) == (4, '{"v": 2}')


def test_a_review_resent_with_a_new_hint_replaces_the_old(tmp_path):
    """Mutant landing-review-ignores-hint: the hint is what OPD distils; a changed one must land."""
    lake = Lakehouse(tmp_path / "lake")
    kw = dict(tenant="acme", session_id="s1", turn_id="s1-t0-0", score=0.5, critique="ok", reviewer="dana", rubric="", review_id=None)
    assert landing.land_review(lake, landing.review_row(hint="Add the two numbers first.", **kw)) is True
    assert landing.land_review(lake, landing.review_row(hint="Add the two numbers first.", **kw)) is False
    assert landing.land_review(lake, landing.review_row(hint="Multiply before adding.", **kw)) is True
    (row,) = lake.read("reviews").to_pylist()
    assert row["hint"] == "Multiply before adding."


def test_a_released_turn_index_is_taken_by_the_next_turn(tmp_path):
    """Mutant landing-release-never: an append that failed gives its index back, so indexes have no gap."""
    reg = landing.SessionRegistry(Lakehouse(tmp_path / "lake"))
    assert [reg.next_turn("s1", "acme") for _ in range(2)] == [0, 1]
    reg.release_turn("s1", 1)
    assert reg.next_turn("s1", "acme") == 1
    reg.release_turn("s1", 0)  # not the last reserved: kept
    assert reg.next_turn("s1", "acme") == 2


# --------------------------------------------------------------------------- the registry after a restart
def test_a_restarted_registry_finds_owners_turns_and_the_next_index_in_the_lakehouse(tmp_path):
    """A gateway process that has not seen a session (a restart) reads its owner, its turn count and
    its turns from the lakehouse; turns it noted itself it answers from memory."""
    lake = Lakehouse(tmp_path / "lake")
    landing.land_records(lake, [_rec("s1", 0, 0, "base", 1), _rec("s1", 0, 1, "base", 1), _rec("s1", 1, 0, "base", 2)])
    reg = landing.SessionRegistry(lake)
    assert reg.owner("s1") == "acme" and reg.owner("nobody") is None
    reg.check("s1", "acme")
    reg.check("nobody", "rival")  # a session nobody has is anyone's to start
    with pytest.raises(landing.Forbidden, match=r"^session 's1' belongs to another tenant$"):
        reg.check("s1", "rival")
    with pytest.raises(landing.Forbidden, match=r"^session 's1' belongs to another tenant$"):
        reg.next_turn("s1", "rival")
    assert reg.next_turn("s1", "acme") == 2  # two turns (three choices) landed: the next is index 2
    assert reg.turn("s1-t1-0") == ("s1", "acme") and reg.turn("s1-t0-1") == ("s1", "acme")
    assert reg.turn("s1-t9-0") is None
    reg.note_turns(["up-1-0", "up-1-1"], "s3", "beta")  # not landed yet: only this process knows them
    assert (reg.turn("up-1-0"), reg.turn("up-1-1")) == (("s3", "beta"), ("s3", "beta"))
    assert landing.SessionRegistry(lake).turn("up-1-0") is None


def test_a_session_row_with_no_turn_count_starts_at_index_zero(tmp_path):
    lake = Lakehouse(tmp_path / "lake")
    landing.land_records(lake, [_rec("s1", 0, 0, "base", 1)])
    lake.replace_in("sessions", "session_id", ["s1"], [{**lake.read("sessions").to_pylist()[0], "turn_count": None}])
    assert landing.SessionRegistry(lake).next_turn("s1", "acme") == 0
