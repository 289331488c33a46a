"""Rules that must hold for every input, checked with Hypothesis (issue 33):

* the training-set digest (lineage): changing any single field of any training sample changes it;
* the inbox parser (task JSONL): no line crashes it; every non-blank line is either a task or a
  quarantine row naming that line; every task fits the ``tasks`` table;
* the gateway's request validation: no body makes a 500; an invalid one is a 4xx, a 422 naming the
  field; nothing invalid lands.

What they found (fixed with them): a JSON integer of more than 4300 digits, an unpaired ``\\ud800``
escape and a deeply nested body crashed the inbox parser or made ``POST /v1/reviews`` answer 500; an
unpaired ``\\udc80`` escape landed as a task no UTF-8 column can store; a lone carriage return split a
JSONL line in two (line numbers then disagreed with the file's).
"""

from __future__ import annotations

import dataclasses
import json
import math
from datetime import datetime, timezone

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from tentalis_pipelines import lineage
from tentalis_pipelines.gateway.app import (
    ChatRequest,
    CompletionRequest,
    GatewayConfig,
    ReviewRequest,
    create_app,
)
from tentalis_pipelines.lakehouse import Lakehouse
from tentalis_pipelines.schemas import SCHEMAS
from tentalis_pipelines.tasks.jsonl import MAX_ID_CHARS, MAX_REFERENCE_CHARS, load_jsonl_tasks
from tentalis_pipelines.training.trainer import TrainSample

NOW = datetime(2026, 1, 1, tzinfo=timezone.utc)
PROPS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                          HealthCheck.too_slow])
LONE_SURROGATES = ("\ud800", "\udbff", "\udc80", "\udfff")

# ------------------------------------------------------------------------------------------ digest
finite = st.floats(allow_nan=False, allow_infinity=True, width=64)
ids = st.lists(st.integers(0, 200_000), max_size=6)


@st.composite
def train_samples(draw) -> TrainSample:
    n = draw(st.integers(0, 5))
    maybe = lambda s: st.none() | s  # noqa: E731
    return TrainSample(
        prompt_ids=draw(ids), completion_ids=draw(st.lists(st.integers(0, 200_000), min_size=n, max_size=n)),
        advantage=draw(finite),
        token_advantages=draw(maybe(st.lists(finite, min_size=n, max_size=n))),
        old_logps=draw(maybe(st.lists(st.none() | finite, min_size=n, max_size=n))),
        temperature=draw(maybe(st.floats(0.0, 2.0))),
        loss_mask=draw(maybe(st.lists(st.integers(0, 1), min_size=n, max_size=n))),
        guided=draw(st.booleans()),
    )


def _other_float(x: float) -> st.SearchStrategy[float]:
    """Any other float, often the nearest one (a digest that rounds must not pass)."""
    # (nextafter(-inf, -inf) is -inf itself: the "other" float must differ, or the test fails for a right digest)
    near = [y for y in (math.nextafter(x, math.inf), math.nextafter(x, -math.inf))
            if repr(y) != repr(float(x)) and (math.isfinite(y) or math.isinf(x))]
    return st.sampled_from(near) | finite.filter(lambda y: repr(float(y)) != repr(float(x)))


def _changed(field: str, value, draw):
    """A different value for one field of a TrainSample (of the same type, or None <-> a value)."""
    if field in ("prompt_ids", "completion_ids"):
        return draw(ids.filter(lambda v: v != value))
    if field == "advantage":
        return draw(_other_float(value))
    if field == "temperature":
        return 1.0 if value is None else draw(st.none() | _other_float(value))
    if field == "guided":
        return not value
    if field in ("token_advantages", "old_logps", "loss_mask"):
        if value is None:
            return []
        if not value:
            return None
        i = draw(st.integers(0, len(value) - 1))
        new = list(value)
        if field == "loss_mask":
            new[i] = 1 - new[i]
        elif new[i] is None:
            new[i] = 0.0
        else:
            new[i] = draw(_other_float(new[i]))
        return new
    raise AssertionError(f"TrainSample has a field {field!r} this test does not know: does samples_digest cover it?")


@PROPS
@given(st.lists(train_samples(), min_size=1, max_size=4), st.data())
def test_changing_any_single_field_of_any_sample_changes_the_digest(samples, data):
    before = lineage.samples_digest(samples)
    assert lineage.samples_digest([dataclasses.replace(s) for s in samples]) == before  # a function of the values
    i = data.draw(st.integers(0, len(samples) - 1))
    field = data.draw(st.sampled_from([f.name for f in dataclasses.fields(TrainSample)]))
    changed = dataclasses.replace(samples[i], **{field: _changed(field, getattr(samples[i], field), data.draw)})
    assert lineage.samples_digest(samples[:i] + [changed] + samples[i + 1:]) != before, field


@pytest.mark.parametrize("field", ["advantage", "temperature", "token_advantages", "old_logps"])
def test_the_digest_sees_the_smallest_change_of_every_float(field):
    s = TrainSample([1], [2, 3], 0.7, token_advantages=[0.1, -0.3], old_logps=[-1.25, None], temperature=0.7)
    value = getattr(s, field)
    bumped = math.nextafter(value, 9) if isinstance(value, float) else [math.nextafter(value[0], 9), *value[1:]]
    assert lineage.samples_digest([s]) != lineage.samples_digest([dataclasses.replace(s, **{field: bumped})])


def test_the_digest_sees_moves_between_samples_and_signed_zero():
    a = TrainSample([1, 2], [3], 0.0)
    assert lineage.samples_digest([a, TrainSample([4], [5], 0.0)]) != lineage.samples_digest([a, TrainSample([], [4, 5], 0.0)])
    assert lineage.samples_digest([a]) != lineage.samples_digest([dataclasses.replace(a, advantage=-0.0)])
    assert lineage.samples_digest([a]) != lineage.samples_digest([a, a])


# ------------------------------------------------------------------------------------------ inbox
json_scalars = (st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats()
                | st.text(max_size=12) | st.sampled_from(LONE_SURROGATES))
json_values = st.recursive(json_scalars, lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=6), c, max_size=3),
                           max_leaves=8)
TASK_KEYS = ("prompt", "reference", "question", "answer", "problem", "solution", "id", "task_id", "unique_id", "difficulty",
             "level", "environment", "metadata")
task_values = (json_values | st.sampled_from(["math", "code", "chat", " ", "", "#### 4", "x\n#### 1,000", "What is 2+2?", "4"])
               | st.integers(0, 2**31 + 1) | st.just(0.5) | st.just(float("nan")))
records = st.dictionaries(st.sampled_from(TASK_KEYS), task_values, max_size=6)


def _line(draw_obj) -> str:
    return json.dumps(draw_obj)  # NaN, Infinity and \\udxxx escapes are what a careless writer emits


raw_lines = st.one_of(
    records.map(_line),
    json_values.map(_line),
    st.text(max_size=40).map(lambda t: t.replace("\n", " ")),
    st.sampled_from(["{", "[" * 5000, '{"prompt": "x", "reference": 1' + "0" * 5000 + "}", '{"prompt": "x",\r"reference": "1"}',
                     '{"prompt": "a", "reference": "1", "id": "dup"}', "   ", "\ufeff{}"]),
)


def _all_text(task: dict) -> list[str]:
    return [v for v in task.values() if isinstance(v, str)]


@PROPS
@given(st.lists(raw_lines, min_size=1, max_size=8), st.binary(max_size=12))
def test_the_inbox_parser_never_crashes_and_accounts_for_every_line(tmp_path_factory, lines, junk):
    path = tmp_path_factory.mktemp("inbox") / "tasks.jsonl"
    body = "\n".join(lines).encode("utf-8", "surrogatepass") + b"\n" + junk
    path.write_bytes(body)
    out = load_jsonl_tasks(path, "b1", NOW)
    physical = body.split(b"\n")
    nonblank = [n for n, raw in enumerate(physical, start=1) if raw.decode("utf-8", "replace").strip()]
    rejected = [r["line"] for r in out.rejects]
    assert len(out.tasks) + len(out.rejects) == len(nonblank)
    assert len(set(rejected)) == len(rejected) and set(rejected) <= set(nonblank)
    assert all(r["error"] and r["source"] == str(path) and r["batch_id"] == "b1" for r in out.rejects)
    seen = set()
    for t in out.tasks:
        assert t["task_id"] not in seen and len(t["task_id"].strip()) >= 1 and len(t["task_id"]) <= max(MAX_ID_CHARS, 20)
        seen.add(t["task_id"])
        assert t["prompt"] and t["prompt"] == t["prompt"].strip() and t["reference"] and len(t["reference"]) <= MAX_REFERENCE_CHARS
        assert t["environment"] in ("math", "code", "chat")
        assert t["difficulty"] is None or (type(t["difficulty"]) is int and 0 <= t["difficulty"] < 2**31)
        assert isinstance(json.loads(t["metadata"]), dict)
        for s in _all_text(t):
            s.encode("utf-8")  # strict: no lone surrogate lands
    if out.tasks:  # every task fits the table's columns (what landing does with them)
        pa.Table.from_pylist(out.tasks, schema=SCHEMAS["tasks"])
    if out.rejects:
        pa.Table.from_pylist([{k: v for k, v in r.items()} for r in out.rejects])


def test_the_inbox_refuses_what_crashed_it_and_keeps_line_numbers(tmp_path):
    lines = ['{"prompt": "x", "reference": 1' + "0" * 5000 + "}", '{"prompt": "x\\ud800", "reference": "1"}',
             '{"prompt": "x\\udc80", "reference": "1"}', '{"prompt": "y",\r"reference": "1"}', '{"prompt": "\\ud83d\\ude00", "reference": "2"}']
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(lines) + "\n", newline="")
    out = load_jsonl_tasks(path, "b1", NOW)
    assert [(t["task_id"], t["prompt"]) for t in out.tasks] == [("b1-L00004", "y"), ("b1-L00005", "\U0001f600")]
    errors = {r["line"]: r["error"] for r in out.rejects}
    assert sorted(errors) == [1, 2, 3] and "4300 digits" in errors[1] and "surrogate" in errors[2] and "surrogate" in errors[3]


# ------------------------------------------------------------------------------------------ gateway
@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    """The gateway app in-process: an upstream backend that is never reached (every body here is
    refused before it would be), so no model and no subprocess."""
    from fastapi.testclient import TestClient

    home = tmp_path_factory.mktemp("gw")
    cfg = GatewayConfig(home=home, lakehouse=home / "lake", upstream="http://127.0.0.1:9", model_name="served", no_auth=True)
    with TestClient(create_app(cfg), raise_server_exceptions=False) as client:
        yield client, Lakehouse(home / "lake")


REVIEW_FIELDS = tuple(ReviewRequest.model_fields)
review_values = json_values | st.floats(-1, 2) | st.text(min_size=0, max_size=300) | st.sampled_from(["s-1", "t-1", 0.5, True])
review_bodies = st.dictionaries(st.sampled_from(REVIEW_FIELDS + ("extra", "\ud800")), review_values, max_size=6)
messages = st.lists(st.dictionaries(st.sampled_from(("role", "content", "name", "tool_calls", "tool_call_id")),
                                    st.sampled_from(("user", "system", "robot")) | json_values, max_size=3), max_size=3)
sampling_values = (json_values | st.integers(-2, 30) | st.floats(-1, 3) | st.sampled_from(["nope", "served-not", "\ud800"]))
chat_bodies = st.fixed_dictionaries({"messages": messages | json_values}, optional={
    k: sampling_values for k in ("model", "n", "temperature", "top_p", "max_tokens", "stream", "stop", "logprobs", "top_logprobs",
                                 "seed", "user", "metadata", "tools", "max_completion_tokens")})
completion_bodies = st.fixed_dictionaries({"prompt": st.lists(st.integers(-1, 5), max_size=3) | json_values}, optional={
    k: sampling_values for k in ("model", "n", "temperature", "top_p", "max_tokens", "echo", "logprobs", "stream")})


def _send(client, path: str, body) -> tuple[int, dict]:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    r = client.post(path, content=content, headers={"content-type": "application/json"})
    assert r.status_code < 500, (path, content[:300], r.text[:500])
    return r.status_code, r.json()


def _names_a_field(body, param: str | None, fields: tuple[str, ...]) -> bool:
    head = (param or "").split(".")[0]
    return head in fields or (isinstance(body, dict) and head in body)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(review_bodies | json_values | st.binary(max_size=20))
def test_no_review_body_makes_a_500_and_none_lands(gateway, body):
    client, lake = gateway
    status, out = _send(client, "/v1/reviews", body)
    assert 400 <= status < 500 and out["error"]["message"]  # no session exists: nothing is accepted
    if status == 422 and out["error"]["param"] != "body":
        assert _names_a_field(body, out["error"]["param"], REVIEW_FIELDS), out
    assert not lake.exists("reviews")


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.sampled_from(["/v1/chat/completions", "/v1/completions"]), st.data())
def test_no_completion_body_makes_a_500_and_errors_name_the_field(gateway, path, data):
    client, lake = gateway
    chat = path == "/v1/chat/completions"
    body = data.draw((chat_bodies if chat else completion_bodies) | json_values | st.binary(max_size=20))
    assume(not (isinstance(body, dict) and body.get("model") == "served"))  # a valid call would go to the (absent) upstream
    status, out = _send(client, path, body)
    assert 400 <= status < 500 and out["error"]["message"]
    model = ChatRequest if chat else CompletionRequest
    if status == 422 and out["error"]["param"] != "body":
        assert _names_a_field(body, out["error"]["param"], tuple(model.model_fields)), out
    if status == 422 and out["error"]["param"] == "body":
        assert not isinstance(body, dict), out
    if status == 404:
        assert out["error"]["param"] == "model"
    assert not lake.exists("turns")


@settings(max_examples=80, deadline=None)
@given(review_bodies)
def test_a_review_request_is_valid_only_with_a_score_in_zero_one(body):
    try:
        r = ReviewRequest.model_validate(body)
    except ValidationError as exc:
        # every error names its field; only a key that is not text (an unpaired surrogate) cannot be named,
        # and the route refuses such a body as invalid JSON before it reaches the model
        assert exc.errors() and all(e["loc"] or e["type"] == "string_unicode" for e in exc.errors())
        return
    raw = body["score"]
    assert not isinstance(raw, bool) and isinstance(raw, (int, float)) and 0.0 <= r.score <= 1.0 and math.isfinite(r.score)
    assert set(body) <= set(REVIEW_FIELDS)
    for name in ("session_id", "turn_id", "review_id"):
        v = getattr(r, name)
        assert v is None or 1 <= len(v) <= 256
    assert 1 <= len(r.reviewer) <= 256


def test_the_bodies_that_made_500s_are_400s(gateway):
    client, _ = gateway
    for body in (b'{"score": 1' + b"0" * 5000 + b"}", b"[" * 100_000, b'{"\\ud800": 1, "score": 0.5, "session_id": "s"}',
                 b'{"score": 0.5, "critique": "\\udc80", "session_id": "s"}'):
        status, out = _send(client, "/v1/reviews", body)
        assert status == 400 and out["error"]["code"] == "invalid_json", out
