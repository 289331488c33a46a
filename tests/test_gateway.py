"""`tentalis serve`: the official openai client as the agent against a real gateway subprocess on the tiny
model; what it acknowledged is in `sessions`/`turns` (and its review in `reviews`), seen through
`tentalis sql`; a SIGKILL loses no acknowledged turn and duplicates none; keys and tenants hold."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from tentalis_pipelines.gateway import chat
from tentalis_pipelines.gateway.auth import create_key, keys_path, list_keys
from tentalis_pipelines.gateway.landing import land_records
from tentalis_pipelines.gateway.wal import Flusher, WriteAheadLog
from tentalis_pipelines.lakehouse import Lakehouse

openai = pytest.importorskip("openai")

TOOLS = [{"type": "function", "function": {"name": "add", "description": "Add two integers.",
                                           "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                                                          "required": ["a", "b"]}}}]


# --------------------------------------------------------------------------- units: templating, tool calls, WAL, keys
def test_parse_tool_calls_hermes_style():
    text = 'Let me add.\n<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>\n<tool_call>{"name": "mul", "arguments": {"a": 1}}</tool_call>'
    content, calls = chat.parse_tool_calls(text, id_prefix="call_x")
    assert content == "Let me add."
    assert [(c["id"], c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [
        ("call_x_0", "add", {"a": 2, "b": 3}), ("call_x_1", "mul", {"a": 1})]
    assert all(c["type"] == "function" for c in calls)
    # only tool calls: content None; an unterminated last call (cut by max_tokens) still parses when its JSON is whole
    assert chat.parse_tool_calls('<tool_call>{"name": "add", "arguments": {}}')[0] is None
    # not JSON, or JSON without a name: stays text
    assert chat.parse_tool_calls("<tool_call>oops</tool_call>") == ("<tool_call>oops</tool_call>", [])
    assert chat.parse_tool_calls('<tool_call>{"x": 1}</tool_call>')[1] == []
    assert chat.parse_tool_calls("plain answer") == ("plain answer", [])
    assert chat.maybe_tool_call_prefix("  <tool_") and not chat.maybe_tool_call_prefix("The answer")


def test_chat_template_renders_tool_calls_and_results(tiny_model_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    messages = [{"role": "user", "content": "What is 2+3?"},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "5"}]
    text, ids = chat.render_chat(tok, messages, TOOLS)
    assert tok.decode(ids) == text
    assert '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>' in text
    assert "<tool_response>\n5\n</tool_response>" in text and "Add two integers." in text
    assert text.endswith("<|im_start|>assistant\n")
    # no tools: the tokenizer's own template, exactly as the pipeline renders prompts
    plain = [{"role": "user", "content": "hi"}]
    assert chat.render_chat(tok, plain)[0] == tok.apply_chat_template(plain, tokenize=False, add_generation_prompt=True)


def _turn(turn_id: str, session: str, index: int, tenant: str = "t") -> dict:
    return {"kind": "turn", "session_metadata": None, "row": {
        "turn_id": turn_id, "session_id": session, "tenant": tenant, "turn_index": index, "choice_index": 0,
        "endpoint": "chat.completions", "model": "m", "policy_version": "base", "backend": "transformers", "messages": "[]",
        "tools": "[]", "response": "{}", "prompt_token_ids": [1, 2], "completion_token_ids": [3], "sampling_logprobs": [-0.5],
        "finish_reason": "stop", "temperature": 1.0, "max_tokens": 4, "stream": False, "prompt_tokens": 2, "completion_tokens": 1,
        "latency_ms": 1.0, "created_at": "2026-01-01T00:00:00+00:00"}}


def test_wal_replay_lands_exactly_once_and_skips_a_torn_line(tmp_path):
    lake = Lakehouse(tmp_path / "lake")
    wal = WriteAheadLog(tmp_path / "wal")
    wal.append([_turn("a-0", "s", 0), _turn("b-0", "s", 1)])
    wal.append([_turn("c-0", "s2", 0)])
    wal.close()
    seg = wal.segments()[-1]
    with open(seg, "ab") as f:
        f.write(b'{"kind": "turn", "row": {"turn_id": "torn')  # a crash mid-write: never acknowledged
    # a flush that committed but died before deleting its segment lands again: the merge changes nothing
    land_records(lake, [r for p in wal.segments() for r in WriteAheadLog.read(p)])
    flusher = Flusher(WriteAheadLog(tmp_path / "wal"), lambda recs: land_records(lake, recs))
    assert flusher.replay() == 3
    assert not list((tmp_path / "wal").glob("*.jsonl"))
    turns = lake.read("turns").to_pylist()
    assert sorted(r["turn_id"] for r in turns) == ["a-0", "b-0", "c-0"]
    sessions = {r["session_id"]: r for r in lake.read("sessions").to_pylist()}
    assert (sessions["s"]["turn_count"], sessions["s2"]["turn_count"]) == (2, 1)


def test_keys_store_only_hashes(tmp_path):
    key, record = create_key(tmp_path, "acme", name="ci")
    path = keys_path(tmp_path)
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    assert key not in path.read_text() and record["sha256"] in path.read_text()
    assert [(k["tenant"], k["name"]) for k in list_keys(tmp_path)] == [("acme", "ci")]
    with pytest.raises(ValueError):
        create_key(tmp_path, "bad tenant!")


# --------------------------------------------------------------------------- a real `tentalis serve`
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_cli(home: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, "TENTALIS_HOME": str(home)}
    return subprocess.run([sys.executable, "-m", "tentalis_pipelines.cli", *args], env=env, capture_output=True, text=True,
                          timeout=timeout, check=True)


class Server:
    def __init__(self, home: Path, model_dir: Path, *extra: str):
        self.home, self.model_dir, self.extra = home, model_dir, extra
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = home / f"serve-{self.port}.log"
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 240) -> Server:
        # Readiness, not speed: a restarted server replays its write-ahead log and loads a model, which
        # took more than 90 s once on a 2-core CI host under a load of 3.
        env = {**os.environ, "TENTALIS_HOME": str(self.home)}
        self.home.mkdir(parents=True, exist_ok=True)
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tentalis_pipelines.cli", "serve", "--port", str(self.port), "--model", str(self.model_dir),
                 "--device", "cpu", "--dtype", "float32", *self.extra], env=env, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.log.read_text()[-3000:]
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise TimeoutError(self.log.read_text()[-3000:])

    def health(self) -> dict:
        return httpx.get(self.url + "/health", timeout=10).json()

    def wait_flushed(self, timeout: float = 30) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            h = self.health()
            if h["wal_pending"] == 0:
                return h
            time.sleep(0.1)
        raise TimeoutError(self.health())

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(timeout=60)


@pytest.fixture(scope="module")
def gateway(tmp_path_factory, tiny_model_dir):
    home = tmp_path_factory.mktemp("gateway-home")
    keys = {"acme": run_cli(home, "keys", "create", "--tenant", "acme").stdout.strip(),  # the CLI prints the key once
            "rival": create_key(home, "rival")[0]}
    server = Server(home, tiny_model_dir, "--flush-interval", "1", "--poll-seconds", "0.5").start()
    yield server, keys
    server.stop()


def gateway_client(server: Server, key: str, session: str | None = None):
    headers = {"X-Session-Id": session} if session else None
    return openai.OpenAI(base_url=server.url + "/v1", api_key=key, default_headers=headers, max_retries=0)


def test_an_agent_session_with_a_tool_call_and_a_stream_lands_and_is_queryable(gateway, tiny_model_dir):
    server, keys = gateway
    agent = gateway_client(server, keys["acme"], "sess-agent-1")
    model = agent.models.list().data[0].id
    assert model == tiny_model_dir.name
    messages = [{"role": "system", "content": "You can add with the add tool."}, {"role": "user", "content": "What is 2+3?"}]
    r1 = agent.chat.completions.create(model=model, messages=messages, tools=TOOLS, max_tokens=6, temperature=0.7, seed=1)
    # the agent's model called the tool (the tiny random model cannot): the call and its result go back
    messages += [{"role": "assistant", "content": None, "tool_calls": [
                     {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}]},
                 {"role": "tool", "tool_call_id": "call_1", "content": "5"}]
    r2 = agent.chat.completions.create(model=model, messages=messages, tools=TOOLS, max_tokens=6, extra_body={"return_token_ids": True})
    messages += [{"role": "assistant", "content": r2.choices[0].message.content or ""}, {"role": "user", "content": "Say it again."}]
    stream = agent.chat.completions.create(model=model, messages=messages, max_tokens=8, stream=True, logprobs=True,
                                           extra_body={"return_token_ids": True})
    streamed_ids, streamed_logprobs, text, finish = [], [], "", None
    for chunk in stream:
        for ch in chunk.choices:
            streamed_ids += (ch.model_extra or {}).get("token_ids") or []
            text += ch.delta.content or ""
            if ch.logprobs and ch.logprobs.content:
                streamed_logprobs += [x.logprob for x in ch.logprobs.content]
            finish = ch.finish_reason or finish
    assert len(streamed_ids) == 8 and finish == "length"
    review = httpx.post(server.url + "/v1/reviews", headers={"Authorization": f"Bearer {keys['acme']}"},
                        json={"session_id": "sess-agent-1", "score": 0.75, "critique": "used the tool", "hint": "answer 5",
                              "reviewer": "manager-1", "rubric": "correctness"})
    assert review.status_code == 200, review.text
    reviews_version = Lakehouse(server.home / "lakehouse").table("reviews").version()
    resent = httpx.post(server.url + "/v1/reviews", headers={"Authorization": f"Bearer {keys['acme']}"},
                        json={"session_id": "sess-agent-1", "score": 0.75, "critique": "used the tool", "hint": "answer 5",
                              "reviewer": "manager-1", "rubric": "correctness"})
    assert resent.json()["review_id"] == review.json()["review_id"]
    assert Lakehouse(server.home / "lakehouse").table("reviews").version() == reviews_version  # a re-sent review changes nothing
    server.wait_flushed()

    query = ("select 'turn' as kind, to_json(t) as row from turns t where session_id = 'sess-agent-1' "
             "union all select 'session', to_json(s) from sessions s where session_id = 'sess-agent-1' "
             "union all select 'review', to_json(r) from reviews r")
    landed = [(r["kind"], json.loads(r["row"])) for r in json.loads(run_cli(server.home, "sql", query, "--format", "json").stdout)]
    turns = sorted((row for kind, row in landed if kind == "turn"), key=lambda t: t["turn_index"])
    sessions = [row for kind, row in landed if kind == "session"]
    reviews = [row for kind, row in landed if kind == "review"]
    assert [t["turn_index"] for t in turns] == [0, 1, 2]
    assert {t["tenant"] for t in turns} == {"acme"} and {t["policy_version"] for t in turns} == {"base"}
    assert [t["stream"] for t in turns] == [False, False, True]
    assert turns[0]["turn_id"] == f"{r1.id}-0" and turns[2]["turn_id"].startswith("chatcmpl-")
    # the stream's token ids and log-probs are the landed ones; the prompt is the exact templated one
    assert turns[2]["completion_token_ids"] == streamed_ids
    assert turns[2]["sampling_logprobs"] == pytest.approx(streamed_logprobs, abs=1e-5)
    assert json.loads(turns[2]["response"]) == {"role": "assistant", "content": text}
    assert turns[1]["prompt_token_ids"] == r2.model_extra["prompt_token_ids"]
    assert turns[1]["completion_token_ids"] == r2.choices[0].model_extra["token_ids"]
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    assert turns[1]["prompt_token_ids"] == chat.render_chat(tok, messages[:4], TOOLS)[1]
    assert "<tool_response>\n5\n</tool_response>" in tok.decode(turns[1]["prompt_token_ids"])
    assert json.loads(turns[1]["messages"])[2]["tool_calls"][0]["function"]["name"] == "add"
    assert json.loads(turns[1]["tools"]) == TOOLS
    assert r1.usage.completion_tokens == turns[0]["completion_tokens"] == len(turns[0]["completion_token_ids"])
    assert r1.usage.prompt_tokens == len(turns[0]["prompt_token_ids"])

    assert len(sessions) == 1
    assert (sessions[0]["tenant"], sessions[0]["turn_count"], sessions[0]["policy_versions"]) == ("acme", 3, ["base"])
    assert len(reviews) == 1
    assert {k: reviews[0][k] for k in ("batch_id", "rollout_id", "session_id", "score", "reviewer", "rubric", "tenant", "hint")} == {
        "batch_id": "live", "rollout_id": "sess-agent-1", "session_id": "sess-agent-1", "score": 0.75, "reviewer": "manager-1",
        "rubric": "correctness", "tenant": "acme", "hint": "answer 5"}


def test_tenants_keys_and_malformed_requests(gateway):
    server, keys = gateway
    acme = {"Authorization": f"Bearer {keys['acme']}"}
    rival = {"Authorization": f"Bearer {keys['rival']}"}
    body = {"model": "tentalis", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    ok = httpx.post(server.url + "/v1/chat/completions", headers={**acme, "X-Session-Id": "sess-tenancy"}, json=body, timeout=60)
    assert ok.status_code == 200
    turn_id = ok.json()["id"] + "-0"
    before = server.wait_flushed()["turns_flushed"]
    # another tenant's key can neither continue nor review the session, nor review its turn
    r = httpx.post(server.url + "/v1/chat/completions", headers={**rival, "X-Session-Id": "sess-tenancy"}, json=body, timeout=60)
    assert r.status_code == 403 and r.json()["error"]["type"] == "permission_error"
    assert httpx.post(server.url + "/v1/reviews", headers=rival, json={"session_id": "sess-tenancy", "score": 1}).status_code == 403
    assert httpx.post(server.url + "/v1/reviews", headers=rival, json={"turn_id": turn_id, "score": 1}).status_code == 403
    # a wrong or missing key: 401, sees nothing
    for headers in ({"Authorization": "Bearer sk-tnt-wrong-key-123456"}, {}):
        r = httpx.post(server.url + "/v1/chat/completions", headers=headers, json=body)
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        assert httpx.get(server.url + "/v1/models", headers=headers).status_code == 401
    # malformed: OpenAI-style error JSON, 4xx, nothing lands
    bad = [
        ({**body, "model": "gpt-9"}, 404, "model"),
        ({**body, "n": "three"}, 422, "n"),
        ({**body, "temperature": 5}, 422, "temperature"),
        ({"model": "tentalis", "messages": []}, 422, "messages"),
    ]
    for payload, status, param in bad:
        r = httpx.post(server.url + "/v1/chat/completions", headers=acme, json=payload)
        assert (r.status_code, r.json()["error"]["param"]) == (status, param), r.text
    r = httpx.post(server.url + "/v1/chat/completions", headers={**acme, "Content-Type": "application/json"}, content=b'{"model": ')
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"
    r = httpx.post(server.url + "/v1/chat/completions", headers={**acme, "Content-Type": "application/json"},
                   content=b" " * (5 * 1024 * 1024))
    assert r.status_code == 413
    # reviews: unknown session 404 naming it; score out of range 422 naming the field; both quarantined
    r = httpx.post(server.url + "/v1/reviews", headers=acme, json={"session_id": "no-such-session", "score": 0.5})
    assert r.status_code == 404 and "no-such-session" in r.json()["error"]["message"]
    for bad in (1.5, True, "0.5", None):  # one rule with import-reviews: a boolean is not a score, nor is text in JSON
        r = httpx.post(server.url + "/v1/reviews", headers=acme, json={"turn_id": turn_id, "score": bad})
        assert r.status_code == 422 and r.json()["error"]["param"] == "score", (bad, r.text)
    h = server.wait_flushed()
    assert h["turns_flushed"] == before  # none of the rejected requests landed a turn
    lake = Lakehouse(server.home / "lakehouse")
    quarantined = lake.read("quarantine").to_pylist()
    assert {"no-such-session" in q["raw"] for q in quarantined} == {True, False}
    assert any("score" in q["error"] for q in quarantined)
    # no key anywhere: not in a table file, not in the log
    for key in keys.values():
        for path in [*(server.home / "lakehouse").rglob("*"), server.log]:
            if path.is_file():
                assert key.encode() not in path.read_bytes(), path


def test_the_policy_switch_is_recorded_per_turn(gateway, tiny_model_dir):
    server, keys = gateway
    from tentalis_pipelines.training import checkpoints as ckpt
    from tentalis_pipelines.training import serving
    from tentalis_pipelines.training.trainer import GRPOConfig, build_policy

    lake = Lakehouse(server.home / "lakehouse")
    agent = gateway_client(server, keys["acme"], "sess-switch")
    agent.chat.completions.create(model="tentalis", messages=[{"role": "user", "content": "a"}], max_tokens=2)
    model = build_policy(tiny_model_dir, None, GRPOConfig())
    path = ckpt.save_adapter(model, server.home / "checkpoints", "ckpt-live")
    ckpt.record_checkpoint(lake, {"checkpoint_id": "ckpt-live", "parent_id": None, "base_model": "tiny", "adapter_uri": str(path),
                                  "algorithm": "grpo", "config": {}, "trained_on": [], "trajectory_ids": [], "trajectory_count": 0,
                                  "metrics": {}, "promoted": False})
    serving.promote(lake, "ckpt-live", actor="test", reason="switch while serving")
    deadline = time.monotonic() + 30
    while server.health()["policy_version"] != "ckpt-live":
        assert time.monotonic() < deadline, server.health()
        time.sleep(0.2)
    agent.chat.completions.create(model="tentalis", messages=[{"role": "user", "content": "b"}], max_tokens=2)
    server.wait_flushed()
    row = lake.dataset("sessions").to_table().to_pylist()
    row = next(r for r in row if r["session_id"] == "sess-switch")
    assert row["policy_versions"] == ["base", "ckpt-live"] and row["turn_count"] == 2


def test_in_flight_requests_finish_on_the_old_policy(tmp_path, tiny_model_dir):
    """The holder swaps the reference; a request that took the old policy keeps decoding on it."""
    from tentalis_pipelines.gateway.policy import PolicyHolder
    from tentalis_pipelines.gateway.sampler import decode
    from tentalis_pipelines.training import checkpoints as ckpt
    from tentalis_pipelines.training import serving
    from tentalis_pipelines.training.trainer import GRPOConfig, build_policy

    lake = Lakehouse(tmp_path / "lake")
    holder = PolicyHolder(lake, tiny_model_dir, poll_seconds=0, device="cpu", dtype="float32")
    old = holder.load()
    steps = decode(old.model, old.tokenizer, [1, 2, 3], max_new_tokens=6, temperature=0.0)
    first = next(steps)  # a request in flight on the base model
    path = ckpt.save_adapter(build_policy(tiny_model_dir, None, GRPOConfig()), tmp_path / "ckpts", "ckpt-x")
    ckpt.record_checkpoint(lake, {"checkpoint_id": "ckpt-x", "parent_id": None, "base_model": "tiny", "adapter_uri": str(path),
                                  "algorithm": "grpo", "config": {}, "trained_on": [], "trajectory_ids": [], "trajectory_count": 0,
                                  "metrics": {}, "promoted": False})
    serving.promote(lake, "ckpt-x", actor="test", reason="t")
    assert holder.refresh() and holder.current().version == "ckpt-x"
    rest = list(steps)  # the old request finishes on its policy object
    assert old.version == "base" and len([first, *rest]) == 6
    serving.rollback(lake, actor="test", reason="back")
    assert holder.refresh() and holder.current().version == "base"


def test_concurrent_calls_share_the_batch_and_their_logprobs_equal_a_recomputation(gateway, tiny_model_dir):
    """Eight agents call at once (one streams, one asks n=2, each with its own temperature, top-p and
    limit): the gateway decodes them in one running batch (/health's peak rows), and every choice's
    sampling log-probs, in the reply and in `turns`, equal a forward pass over prompt + reply at that
    call's temperature (the trainer's recomputation)."""
    import torch

    from tentalis_pipelines.inference.transformers_backend import load_policy

    server, keys = gateway
    settings = [dict(temperature=0.6 + 0.1 * i, top_p=1.0 if i % 2 else 0.9, max_tokens=24 + 4 * i, n=2 if i == 3 else 1)
                for i in range(8)]
    replies: dict[int, dict] = {}
    barrier = threading.Barrier(len(settings))

    def agent(i: int) -> None:
        kw = settings[i]
        messages = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": f"Count to {i + 3}."}]
        c = gateway_client(server, keys["acme"], f"sess-batch-{i}")
        barrier.wait()
        if i == 5:  # a streamed call in the same batch
            ids, lps = [], []
            for chunk in c.chat.completions.create(model="tentalis", messages=messages, stream=True, logprobs=True,
                                                   extra_body={"return_token_ids": True}, **kw):
                for ch in chunk.choices:
                    ids += (ch.model_extra or {}).get("token_ids") or []
                    lps += [x.logprob for x in (ch.logprobs.content if ch.logprobs and ch.logprobs.content else [])]
            replies[i] = {"choices": [(ids, lps)], "prompt": None}
            return
        r = c.chat.completions.create(model="tentalis", messages=messages, logprobs=True, extra_body={"return_token_ids": True}, **kw)
        replies[i] = {"choices": [(ch.model_extra["token_ids"], [x.logprob for x in ch.logprobs.content]) for ch in r.choices],
                      "prompt": r.model_extra["prompt_token_ids"]}

    threads = [threading.Thread(target=agent, args=(i,)) for i in range(len(settings))]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=300)
    assert sorted(replies) == list(range(8))
    batching = server.health()["batching"]
    assert batching["peak_rows"] >= 3, batching  # calls decoded side by side, not one after another
    server.wait_flushed()
    turns = {(t["session_id"], t["choice_index"]): t for t in Lakehouse(server.home / "lakehouse").read("turns").to_pylist()
             if t["session_id"].startswith("sess-batch-")}
    model, _ = load_policy(tiny_model_dir)
    for i, kw in enumerate(settings):
        assert len(replies[i]["choices"]) == kw["n"]
        for k, (ids, lps) in enumerate(replies[i]["choices"]):
            turn = turns[(f"sess-batch-{i}", k)]
            prompt = turn["prompt_token_ids"]
            assert replies[i]["prompt"] in (None, prompt)
            assert turn["completion_token_ids"] == ids and turn["sampling_logprobs"] == pytest.approx(lps, abs=1e-6)
            assert 0 < len(ids) <= kw["max_tokens"]
            with torch.no_grad():
                logits = model(torch.tensor([prompt + ids])).logits[0, len(prompt) - 1 : -1].float() / kw["temperature"]
            expected = torch.log_softmax(logits, -1).gather(1, torch.tensor(ids)[:, None]).squeeze(1)
            assert torch.allclose(torch.tensor(lps), expected, atol=1e-4), (i, k)


def test_sigkill_loses_no_acknowledged_turn_and_duplicates_none(gateway):
    """Rounds of 32 concurrent sessions, each ended by a SIGKILL of the gateway at a seeded random moment,
    then a restart (which replays the WAL): every acknowledged turn is in `turns` exactly once, every
    landed turn is whole, and the only unacknowledged ones that land are calls in flight at the kill
    (durable, their response cut off). (Last in the module: it restarts the module's server.)"""
    import random

    server, keys = gateway
    headers = {"Authorization": f"Bearer {keys['acme']}"}
    lake = Lakehouse(server.home / "lakehouse")
    rng = random.Random(20261126)
    acked: list[str] = []
    wal_only_rounds = 0
    for rnd in range(3):
        lock = threading.Lock()
        stop = threading.Event()
        round_acked: list[str] = []

        def agent(i: int, rnd: int = rnd, round_acked: list[str] = round_acked, lock=lock, stop=stop) -> None:
            with httpx.Client(timeout=30) as c:
                for k in range(200):
                    if stop.is_set():
                        return
                    try:
                        r = c.post(server.url + "/v1/chat/completions", headers={**headers, "X-Session-Id": f"load-{i}"},
                                   json={"model": "tentalis", "messages": [{"role": "user", "content": f"r{rnd} q{k}"}],
                                         "max_tokens": 1})
                    except httpx.HTTPError:
                        return  # killed mid-request: never acknowledged
                    if r.status_code == 200:
                        with lock:
                            round_acked.append(r.json()["id"] + "-0")

        before = set(lake.read("turns", columns=["turn_id"])["turn_id"].to_pylist()) if lake.exists("turns") else set()
        threads = [threading.Thread(target=agent, args=(i,)) for i in range(32)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 30
        while not round_acked and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(rng.uniform(0.0, 2.5))  # a random moment: mid-append, mid-flush, mid-merge, between calls
        server.proc.send_signal(signal.SIGKILL)
        server.proc.wait()
        stop.set()
        for t in threads:
            t.join()
        assert round_acked, f"round {rnd}: no call was acknowledged before the kill"
        landed_at_kill = set(lake.read("turns", columns=["turn_id"])["turn_id"].to_pylist()) if lake.exists("turns") else set()
        wal_only_rounds += bool(set(round_acked) - landed_at_kill)
        acked += round_acked
        server.start()  # replays the WAL before it serves
        rows = lake.read("turns", columns=["turn_id", "completion_tokens", "completion_token_ids", "response"]).to_pylist()
        ids = [r["turn_id"] for r in rows]
        assert len(ids) == len(set(ids)), f"round {rnd}: a turn landed twice"
        assert set(acked) <= set(ids), f"round {rnd}: acknowledged turns lost: {sorted(set(acked) - set(ids))[:5]}"
        assert len(set(ids) - before - set(round_acked)) <= 32, f"round {rnd}: more unacknowledged turns landed than were in flight"
        assert all(len(r["completion_token_ids"]) == r["completion_tokens"] and json.loads(r["response"]) for r in rows)
    assert wal_only_rounds, "no kill caught an acknowledged turn that was only in the WAL"
    assert server.health()["wal_pending"] == 0
    # one turn index per call, per session, from 0 without gaps; session rows agree with the turns
    rows = lake.read("turns", columns=["session_id", "turn_index", "choice_index"]).to_pylist()
    by: dict[str, list[int]] = {}
    for r in rows:
        if r["choice_index"] == 0:  # a call with n choices is one turn index on n rows
            by.setdefault(r["session_id"], []).append(r["turn_index"])
    assert all(sorted(v) == list(range(len(v))) for v in by.values())
    assert {r["session_id"]: r["turn_count"] for r in lake.read("sessions").to_pylist()} == {s: len(v) for s, v in by.items()}


def test_upstream_mode_forwards_and_records(tmp_path, tiny_model_dir):
    """--upstream: the reply is the upstream's, streamed or not; each choice lands with the upstream's token
    ids and log-probs and the locally templated prompt ids."""
    from fastapi.testclient import TestClient
    from transformers import AutoTokenizer

    from tentalis_pipelines.gateway.app import GatewayConfig, create_app

    seen: list[dict] = []

    def upstream(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        seen.append(body)
        if body.get("stream"):
            chunks = [{"id": "up-2", "choices": [{"index": 0, "delta": {"role": "assistant", "content": "Hel"}, "token_ids": [10],
                                                  "logprobs": {"content": [{"token": "Hel", "logprob": -0.5}]}}]},
                      {"id": "up-2", "choices": [{"index": 0, "delta": {"content": "lo"}, "token_ids": [11],
                                                  "logprobs": {"content": [{"token": "lo", "logprob": -0.25}]}, "finish_reason": "stop"}]}]
            text = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
            return httpx.Response(200, text=text, headers={"content-type": "text/event-stream"})
        return httpx.Response(200, json={"id": "up-1", "object": "chat.completion", "model": "big", "choices": [
            {"index": 0, "finish_reason": "tool_calls", "message": {"role": "assistant", "content": None, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "add", "arguments": "{\"a\": 1, \"b\": 2}"}}]}}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}})

    cfg = GatewayConfig(home=tmp_path, lakehouse=tmp_path / "lakehouse", model_dir=tiny_model_dir, model_name="big",
                        upstream="http://upstream.invalid/v1", no_auth=True, flush_interval=3600)
    messages = [{"role": "user", "content": "1+2?"}]
    with TestClient(create_app(cfg)) as client:
        gw = client.app.state.gateway
        gw.upstream.client = httpx.AsyncClient(base_url=gw.upstream.base_url, transport=httpx.MockTransport(upstream))
        r = client.post("/v1/chat/completions", headers={"X-Session-Id": "up"}, json={"model": "big", "messages": messages, "tools": TOOLS})
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "add"
        with client.stream("POST", "/v1/chat/completions", headers={"X-Session-Id": "up"},
                           json={"model": "big", "messages": messages, "stream": True, "logprobs": True}) as s:
            lines = [x for x in s.iter_lines() if x.startswith("data:")]
        assert lines[-1] == "data: [DONE]" and len(lines) == 3
        assert client.post("/v1/chat/completions", json={"model": "other", "messages": messages}).status_code == 404
        gw.flusher.flush()
    assert seen[0]["model"] == "big" and seen[0]["tools"] == TOOLS
    turns = sorted(Lakehouse(tmp_path / "lakehouse").read("turns").to_pylist(), key=lambda t: t["turn_index"])
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    assert [t["policy_version"] for t in turns] == ["upstream:big", "upstream:big"]
    assert turns[0]["prompt_token_ids"] == chat.render_chat(tok, messages, TOOLS)[1]
    assert json.loads(turns[0]["response"])["tool_calls"][0]["function"]["arguments"] == "{\"a\": 1, \"b\": 2}"
    assert turns[0]["finish_reason"] == "tool_calls" and turns[0]["backend"] == "openai"
    assert (turns[1]["completion_token_ids"], turns[1]["sampling_logprobs"]) == ([10, 11], [-0.5, -0.25])
    assert json.loads(turns[1]["response"]) == {"role": "assistant", "content": "Hello"} and turns[1]["stream"]


def test_a_segment_opened_while_the_flusher_lists_is_not_taken_for_sealed(tmp_path):
    """The race the live-learning run hit: an append that opens a new segment while ``sealed()`` lists
    the folder must not have that (active) segment landed half-written and then deleted."""
    wal = WriteAheadLog(tmp_path)
    wal.append([{"turn_id": "t0"}])
    wal.seal()
    real = wal.segments
    appender: list[threading.Thread] = []

    def listing():
        if not appender:  # an agent's call arrives exactly while the flusher lists the folder
            appender.append(threading.Thread(target=wal.append, args=([{"turn_id": "t1"}],)))
            appender[0].start()
            appender[0].join(0.3)
        return real()

    wal.segments = listing
    sealed = wal.sealed()
    appender[0].join()
    wal.segments = real
    active = set(real()) - set(sealed)
    assert [r["turn_id"] for p in sealed for r in WriteAheadLog.read(p)] == ["t0"]
    assert [r["turn_id"] for p in active for r in WriteAheadLog.read(p)] == ["t1"]  # still in the WAL, landed next flush
