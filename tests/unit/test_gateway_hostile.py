"""What a hostile tester broke in the gateway (issue 73), through the real FastAPI app with API keys and
two tenants: another tenant's review id, a chunked body past the limit, foreign JSON values (a seed no
generator takes, a lone surrogate, ``true`` as a number), a flood of prompts, and a flood of rejects
into ``quarantine``. The upstream is a function in the test (no model, no server, no subprocess)."""

from __future__ import annotations

import asyncio
import json

import pytest
from fastapi.testclient import TestClient

from tentalis_pipelines.gateway import landing
from tentalis_pipelines.gateway.app import SEED_MAX, SEED_MIN, BodyLimit, GatewayConfig, create_app
from tentalis_pipelines.gateway.auth import create_key
from tentalis_pipelines.gateway.quarantine import QuarantineGate
from tentalis_pipelines.lakehouse import Lakehouse

MESSAGES = [{"role": "user", "content": "What is 2 + 2?"}]
LIMIT = 4096  # max_body_bytes of these tests: small, so a body past it is cheap to send


def _app(tmp_path, **overrides):
    settings = {"max_body_bytes": LIMIT, **overrides}
    cfg = GatewayConfig(home=tmp_path, lakehouse=tmp_path / "lake", upstream="http://127.0.0.1:9", model_name="served",
                        flush_interval=60.0, **settings)
    return create_app(cfg)


@pytest.fixture
def gateway(tmp_path):
    keys = {t: {"Authorization": f"Bearer {create_key(tmp_path, t)[0]}"} for t in ("acme", "rival")}
    with TestClient(_app(tmp_path)) as client:
        gw = client.app.state.gateway
        sent: list[tuple[str, dict]] = []

        async def post(path, body):
            sent.append((path, body))
            return {"id": f"up-{len(sent)}", "choices": [
                {"index": 0, "message": {"role": "assistant", "content": "4"}, "text": "4", "finish_reason": "stop"}]}

        gw.upstream.post = post
        yield client, gw, keys, sent


def _chat(client, headers, session, **extra):
    return client.post("/v1/chat/completions", headers={**headers, "X-Session-Id": session},
                       json={"model": "served", "messages": MESSAGES, **extra})


def _reviews(gw) -> list[dict]:
    return [r for r in Lakehouse(gw.cfg.lakehouse).read("reviews").to_pylist() if r["batch_id"] == "live"]


# --------------------------------------------------------------------------- 1. another tenant's review
def test_a_tenant_cannot_replace_another_tenants_review_by_its_review_id(gateway):
    """The default review id is a hash of tenant, target and reviewer, so a rival can compute acme's; sent
    with a review of the rival's own session, it replaced acme's row. Now that id is refused (422: a
    derived id that is not the rival's), a free-form id acme chose is refused as taken (403), and acme's
    reviews are as acme sent them."""
    client, gw, keys, _ = gateway
    assert _chat(client, keys["acme"], "s-acme").status_code == 200
    assert _chat(client, keys["rival"], "s-rival").status_code == 200
    gw.flusher.flush()
    mine = client.post("/v1/reviews", headers=keys["acme"], json={"session_id": "s-acme", "score": 0.9, "critique": "good"})
    assert mine.status_code == 200, mine.text
    derived = mine.json()["review_id"]
    assert derived == landing.default_review_id("acme", "session:s-acme", "manager")  # computable by anyone
    chosen = client.post("/v1/reviews", headers=keys["acme"],
                         json={"session_id": "s-acme", "score": 0.6, "reviewer": "lead", "review_id": "team-review-1"})
    assert chosen.status_code == 200, chosen.text
    for taken, status, code in ((derived, 422, "review_id_reserved"), ("team-review-1", 403, "review_id_taken")):
        r = client.post("/v1/reviews", headers=keys["rival"],
                        json={"session_id": "s-rival", "score": 0.0, "critique": "forged", "review_id": taken})
        assert r.status_code == status, r.text
        err = r.json()["error"]
        assert (err["param"], err["code"]) == ("review_id", code)
        assert taken in err["message"]
    assert client.post("/v1/reviews", headers=keys["rival"], json={"session_id": "s-rival", "score": 0.0, "review_id": "team-review-1"}
                       ).json()["error"]["type"] == "permission_error"
    rows = sorted((r["review_id"], r["tenant"], r["session_id"], r["score"], r["critique"]) for r in _reviews(gw))
    assert rows == sorted([(derived, "acme", "s-acme", 0.9, "good"), ("team-review-1", "acme", "s-acme", 0.6, "")])
    # the rival's own review with its own id lands beside them; acme can still change its own
    assert client.post("/v1/reviews", headers=keys["rival"], json={"session_id": "s-rival", "score": 0.2}).status_code == 200
    assert client.post("/v1/reviews", headers=keys["acme"], json={"session_id": "s-acme", "score": 0.4}).status_code == 200
    assert sorted((r["tenant"], r["score"]) for r in _reviews(gw)) == [("acme", 0.4), ("acme", 0.6), ("rival", 0.2)]


def test_land_review_refuses_a_foreign_review_id_and_leaves_the_table_alone(tmp_path):
    lake = Lakehouse(tmp_path / "lake")
    row = landing.review_row(tenant="acme", session_id="s1", turn_id=None, score=1.0, critique="", hint="", reviewer="m",
                             rubric="", review_id="rev-shared")
    assert landing.land_review(lake, row) is True
    version = lake.table("reviews").version()
    forged = {**row, "tenant": "rival", "session_id": "s2", "rollout_id": "s2", "score": 0.0}
    with pytest.raises(landing.Forbidden, match="rev-shared"):
        landing.land_review(lake, forged)
    assert lake.table("reviews").version() == version
    assert [(r["tenant"], r["score"]) for r in lake.read("reviews").to_pylist()] == [("acme", 1.0)]


# --------------------------------------------------------------------------- 2. the body limit on a chunked body
def _chunks(total: int, size: int, pulled: list[int]):
    """A JSON chat body of exactly ``total`` bytes, sent in ``size``-byte chunks (no Content-Length:
    httpx sends a generator with Transfer-Encoding: chunked); ``pulled`` counts the chunks read."""
    head = json.dumps({"model": "served", "messages": MESSAGES}).encode()
    body = head[:-1] + b" " * (total - len(head)) + b"}"
    assert len(body) == total
    for i in range(0, total, size):
        pulled.append(i)
        yield body[i:i + size]


@pytest.mark.parametrize("total,status", [(LIMIT, 200), (LIMIT + 1, 413), (40 * LIMIT, 413)])
def test_a_chunked_body_is_measured_as_it_is_read(gateway, total, status):
    """At the limit exactly it is served; one byte past it, 413 (the old check looked only at
    Content-Length, so a chunked body of any size was read and served)."""
    client, _, keys, sent = gateway
    r = client.post("/v1/chat/completions", headers={**keys["acme"], "Content-Type": "application/json"},
                    content=_chunks(total, 512, []))
    assert r.status_code == status, r.text
    if status == 413:
        assert r.json()["error"]["code"] == "request_too_large" and str(LIMIT) in r.json()["error"]["message"]
        assert not sent
    else:
        assert len(sent) == 1


def test_the_limit_stops_reading_at_the_first_chunk_past_it():
    """The ASGI middleware alone, fed chunk by chunk (the test client reads a body whole before the app
    sees it; tests/test_gateway_limits.py sends one over a real socket): the chunks after the one that
    crossed the limit are never asked for, and the app never runs."""
    pulled: list[int] = []
    source = _chunks(40 * LIMIT, 512, pulled)
    sent: list[dict] = []
    ran: list[bool] = []

    async def app(scope, receive, send):
        ran.append(True)

    async def receive():
        chunk = next(source)
        return {"type": "http.request", "body": chunk, "more_body": True}

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions", "headers": [(b"transfer-encoding", b"chunked")]}
    asyncio.run(BodyLimit(app, LIMIT)(scope, receive, send))
    assert len(pulled) == LIMIT // 512 + 1 and not ran
    assert sent[0]["status"] == 413 and b"request_too_large" in sent[1]["body"]


def test_a_body_within_the_limit_reaches_the_app_whole_and_once():
    chunks = [b'{"a": ', b"1", b"}"]
    got: list[dict] = []

    async def app(scope, receive, send):
        got.append(await receive())
        got.append(await receive())  # after the body: what the client sends next (here: it went away)

    async def receive():
        if chunks:
            return {"type": "http.request", "body": chunks.pop(0), "more_body": bool(chunks)}
        return {"type": "http.disconnect"}

    async def send(message):
        raise AssertionError(message)

    asyncio.run(BodyLimit(app, 8)(({"type": "http", "headers": []}), receive, send))
    assert got == [{"type": "http.request", "body": b'{"a": 1}', "more_body": False}, {"type": "http.disconnect"}]


def test_a_content_length_over_the_limit_is_refused_before_reading(gateway):
    client, _, keys, sent = gateway
    r = client.post("/v1/chat/completions", headers={**keys["acme"], "Content-Type": "application/json"},
                    content=b" " * (LIMIT + 1))
    assert r.status_code == 413 and not sent


# --------------------------------------------------------------------------- 3. and 4. foreign JSON values
@pytest.mark.parametrize("field", ["n", "temperature", "top_p", "max_tokens", "seed", "max_completion_tokens", "top_logprobs"])
@pytest.mark.parametrize("value", [True, False])
def test_a_boolean_is_not_a_number_in_any_chat_sampling_field(gateway, field, value):
    client, _, keys, sent = gateway
    r = _chat(client, keys["acme"], "s-bool", **{field: value})
    assert r.status_code == 422, r.text
    assert r.json()["error"]["param"] == field and "boolean" in r.json()["error"]["message"]
    assert not sent


@pytest.mark.parametrize("field", ["n", "temperature", "top_p", "max_tokens", "seed", "logprobs"])
def test_a_boolean_is_not_a_number_in_any_completions_field(gateway, field):
    client, _, keys, sent = gateway
    r = client.post("/v1/completions", headers=keys["acme"], json={"model": "served", "prompt": "2 + 2 =", field: True})
    assert r.status_code == 422 and r.json()["error"]["param"] == field, r.text
    assert not sent


def test_booleans_are_not_token_ids(gateway):
    client, _, keys, sent = gateway
    for prompt in ([1, True, 3], [[1, 2], [False]]):
        r = client.post("/v1/completions", headers=keys["acme"], json={"model": "served", "prompt": prompt})
        assert r.status_code == 422 and r.json()["error"]["param"] == "prompt", r.text
    assert not sent


@pytest.mark.parametrize("seed,status", [(1e30, 422), (SEED_MAX + 1, 422), (SEED_MIN - 1, 422), (SEED_MAX, 200), (SEED_MIN, 200),
                                         (0, 200)])
def test_the_seed_is_bounded_to_what_a_generator_takes(gateway, seed, status):
    """seed 1e30 was a 500 (torch's generator refused it mid-request); the bounds themselves are served."""
    client, _, keys, sent = gateway
    r = _chat(client, keys["acme"], "s-seed", seed=seed)
    assert r.status_code == status, r.text
    if status == 422:
        assert r.json()["error"]["param"] == "seed" and not sent
    else:
        assert sent[-1][1]["seed"] == seed


@pytest.mark.parametrize("where,param", [
    ({"messages": [{"role": "system", "content": "ok"}, {"role": "user", "content": "hi \ud800 there"}]}, "messages.1.content"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "\udfff"}]}]}, "messages.0.content.0.text"),
    ({"messages": MESSAGES, "stop": ["\n", "x\ud83d"]}, "stop.1"),
    ({"messages": MESSAGES, "metadata": {"\udc80": "v"}}, "metadata.\\udc80"),
])
def test_a_lone_surrogate_is_a_400_naming_the_field(gateway, where, param):
    """A lone surrogate escape parses as JSON but is no Unicode text: it was a 500 (the tokenizer, or the
    turn's UTF-8 column, failed on it); now 400 naming where it is, and nothing is sent or lands."""
    client, gw, keys, sent = gateway
    raw = json.dumps({"model": "served", **where})  # ensure_ascii: the escape travels as \\ud800, as a client sends it
    r = client.post("/v1/chat/completions", headers={**keys["acme"], "Content-Type": "application/json"}, content=raw)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert (err["param"], err["code"]) == (param, "invalid_json") and "surrogate" in err["message"]
    assert not sent and gw.wal.segments() == []


def test_a_lone_surrogate_in_a_completions_prompt_is_a_400(gateway):
    client, _, keys, sent = gateway
    raw = json.dumps({"model": "served", "prompt": ["fine", "bad \ud800"]})
    r = client.post("/v1/completions", headers={**keys["acme"], "Content-Type": "application/json"}, content=raw)
    assert (r.status_code, r.json()["error"]["param"]) == (400, "prompt.1") and not sent


# --------------------------------------------------------------------------- 5. prompts per call
@pytest.mark.parametrize("prompt,status", [
    (["p"] * 16, 200), (["p"] * 17, 422), ([[1, 2]] * 16, 200), ([[1, 2]] * 17, 422),
    (list(range(1, 200)), 200),  # one prompt of 199 token ids is one prompt, not 199
    ("p" * 500, 200),
])
def test_the_prompts_of_one_completions_call_are_capped(gateway, prompt, status):
    """200 prompts held the model 41 s: at most max_prompts (16 by default) per call, the cap named."""
    client, _, keys, sent = gateway
    r = client.post("/v1/completions", headers=keys["acme"], json={"model": "served", "prompt": prompt, "max_tokens": 1})
    assert r.status_code == status, r.text
    if status == 422:
        err = r.json()["error"]
        assert (err["param"], err["code"]) == ("prompt", "too_many_prompts") and "at most 16" in err["message"]
        assert "17 prompts" in err["message"] and not sent


def test_the_prompt_cap_is_a_setting(tmp_path):
    with TestClient(_app(tmp_path, no_auth=True, max_prompts=2)) as client:
        r = client.post("/v1/completions", json={"model": "served", "prompt": ["a", "b", "c"]})
        assert r.status_code == 422 and "at most 2" in r.json()["error"]["message"]


# --------------------------------------------------------------------------- 6. the quarantine flood
def test_a_tenants_rejects_are_kept_at_a_bounded_rate_and_size(tmp_path):
    """A key holder sending rejected reviews in a loop grew `quarantine` by a whole body (100 kB) and a
    commit per request. Now the raw text kept is clipped, and past the tenant's per-minute budget a
    reject is answered but not kept; another tenant's budget is its own."""
    keys = {t: {"Authorization": f"Bearer {create_key(tmp_path, t)[0]}"} for t in ("acme", "rival")}
    with TestClient(_app(tmp_path, max_body_bytes=1 << 20, quarantine_per_minute=3, quarantine_raw_chars=1000)) as client:
        gw = client.app.state.gateway
        big = {"session_id": "no-such-session", "score": 0.5, "critique": "x" * 50_000}
        for _ in range(5):
            r = client.post("/v1/reviews", headers=keys["acme"], json=big)
            assert r.status_code == 404  # every reject is still answered with its error
        r = client.post("/v1/reviews", headers=keys["rival"], json={"session_id": "nope", "score": 2})
        assert r.status_code == 422
        kept = Lakehouse(gw.cfg.lakehouse).read("quarantine").to_pylist()
        by_tenant = sorted(q["stage"] for q in kept)
        assert by_tenant == ["live_review:acme"] * 3 + ["live_review:rival"]
        acme = [q for q in kept if q["stage"] == "live_review:acme"]
        assert all(len(q["raw"]) < 1100 and q["raw"].startswith('{"session_id":"no-such-session"') for q in acme)
        assert all("clipped: 50" in q["raw"] for q in acme)
        assert client.get("/health").json()["quarantine_dropped"] == 2


def test_bridge_rejects_share_the_tenants_quarantine_budget(tmp_path):
    with TestClient(_app(tmp_path, no_auth=True, quarantine_per_minute=2, quarantine_raw_chars=100)) as client:
        gw = client.app.state.gateway
        for _ in range(4):
            r = client.post("/feedback", json={"task_id": "no-such-task", "score": 1, "critique": "y" * 2000})
            assert r.status_code == 422, r.text
        kept = Lakehouse(gw.cfg.lakehouse).read("quarantine").to_pylist()
        assert len(kept) == 2 and all(len(q["raw"]) < 200 for q in kept)


def test_the_gate_refills_at_its_rate_per_tenant():
    now = [0.0]
    gate = QuarantineGate(per_minute=2, raw_chars=4, clock=lambda: now[0])
    assert [gate.admit("a") for _ in range(3)] == [True, True, False]
    assert gate.admit("b") is True  # its own bucket
    now[0] = 29.0
    assert gate.admit("a") is False  # one token per 30 s
    now[0] = 30.0
    assert gate.admit("a") is True and gate.admit("a") is False
    now[0] = 10_000.0
    assert [gate.admit("a") for _ in range(3)] == [True, True, False]  # the burst never exceeds per_minute
    assert gate.dropped == 4
    assert gate.clip("abcd") == "abcd" and gate.clip("abcde").startswith("abcd...[clipped: 5 characters")
    none = QuarantineGate(per_minute=0, raw_chars=0)  # 0: keep no rejects at all
    assert none.admit("a") is False and none.clip("") == "" and none.clip("x").startswith("...[clipped: 1")
    for bad in (-1, True, 1.5):
        with pytest.raises(ValueError, match="quarantine_per_minute"):
            QuarantineGate(per_minute=bad)


def test_a_tenant_cannot_claim_another_tenants_future_review_id_first(gateway):
    """Refusing a taken id must not let a rival squat one: acme's default id for a review it has not sent
    yet is computable, so a rival landing a review under it first would get acme's review refused.
    Derived-looking ids (rev-, verdict-, judge-) are the client's only when they are its own."""
    client, gw, keys, _ = gateway
    assert _chat(client, keys["acme"], "s-acme").status_code == 200
    assert _chat(client, keys["rival"], "s-rival").status_code == 200
    gw.flusher.flush()
    future = landing.default_review_id("acme", "session:s-acme", "manager")
    for squat in (future, "verdict-0123456789abcdef01234567", "judge-0123456789abcdef"):
        r = client.post("/v1/reviews", headers=keys["rival"], json={"session_id": "s-rival", "score": 0.0, "review_id": squat})
        assert r.status_code == 422, r.text
        assert (r.json()["error"]["param"], r.json()["error"]["code"]) == ("review_id", "review_id_reserved")
    mine = client.post("/v1/reviews", headers=keys["acme"], json={"session_id": "s-acme", "score": 0.7})
    assert mine.status_code == 200 and mine.json()["review_id"] == future
    # its own derived id, sent back explicitly, and a free-form id are the client's to use
    again = client.post("/v1/reviews", headers=keys["acme"], json={"session_id": "s-acme", "score": 0.8, "review_id": future})
    assert again.status_code == 200, again.text
    own = client.post("/v1/reviews", headers=keys["rival"], json={"session_id": "s-rival", "score": 0.1, "review_id": "my-review-1"})
    assert own.status_code == 200, own.text
    assert sorted((r["tenant"], r["review_id"], r["score"]) for r in _reviews(gw)) == [("acme", future, 0.8), ("rival", "my-review-1", 0.1)]
