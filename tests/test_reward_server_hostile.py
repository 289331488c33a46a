"""`tentalis reward-server` under hostile requests (issue 73), as a user starts it: `/health` answers while
a long request is being scored (before, a 16 KB query stalled the event loop for 50 s), and the inputs
that gave 500s (deeply nested JSON, a 5,000-digit number, a 3,000-term expression) get a 400 or a
scored reward. Latency targets are measured by ``python -m bench reward_server``, not asserted here;
the bounds below are only generous enough to tell "answered" from "stalled"."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time

import httpx
import pytest

PROMPT = "<|im_start|>user\nTom has 12 marbles and finds 7 more. How many marbles does he have?<|im_end|>\n<|im_start|>assistant\n"
RIGHT = PROMPT + "<step>12 + 7 = 19</step>\n<answer>19</answer><|im_end|>"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server():
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "tentalis_pipelines.cli", "reward-server", "--port", str(port), "--workers", "1"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env={**os.environ, "OMP_NUM_THREADS": "1"})
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the reward server did not start: {proc.stdout.read().decode()[-2000:]}")
            time.sleep(0.3)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:  # a server stalled in its handler does not see SIGTERM
            proc.kill()
            proc.wait(timeout=30)


def test_health_answers_while_a_long_request_is_scored(server):
    # 48 samples of 150,000 characters of "1+1+..." without "=" (the issue's stall, ten times longer,
    # many times over): seconds of scoring in the worker, during which the event loop must stay free.
    hostile = "1+" * 75_000
    body = {"query": [hostile] * 48, "prompts": [PROMPT] * 48, "labels": ["19"] * 48}
    result: dict = {}

    def post():
        try:
            result["response"] = httpx.post(f"{server}/get_reward", json=body, timeout=120)
        except httpx.HTTPError as exc:
            result["error"] = exc

    t = threading.Thread(target=post)
    t.start()
    latencies, while_running = [], 0
    try:
        time.sleep(0.5)  # the body is sent and being scored
        while t.is_alive() and len(latencies) < 40:
            t0 = time.monotonic()
            r = httpx.get(f"{server}/health", timeout=10)
            latencies.append(time.monotonic() - t0)
            assert r.status_code == 200 and r.json() == {"ok": True}
            while_running += t.is_alive()
            time.sleep(0.05)
    finally:
        t.join(timeout=150)
    assert while_running >= 3, f"the request finished before /health was asked {latencies}"
    assert max(latencies) < 2.0, f"/health stalled while a request was scored: {latencies}"
    assert "error" not in result, result
    r = result["response"]
    assert r.status_code == 200 and r.json()["rewards"] == [0.0] * 48


def test_the_16_kb_query_of_the_issue_is_scored_at_once(server):
    t0 = time.monotonic()
    r = httpx.post(f"{server}/get_reward", json={"query": [PROMPT + "1+" * 8_000], "prompts": [PROMPT], "labels": ["19"]}, timeout=60)
    assert r.status_code == 200 and r.json()["rewards"] == [0.0]
    assert time.monotonic() - t0 < 10  # 50 s before; the 1 s target is measured by the benchmark


@pytest.mark.parametrize(("content", "says"), [
    (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
    (b'{"query": ["q"], "prompts": ["p"], "labels": [' + b"9" * 5000 + b"]}", "send long labels as strings"),
])
def test_bodies_that_gave_500s_get_a_400(server, content, says):
    r = httpx.post(f"{server}/get_reward", content=content, headers={"content-type": "application/json"}, timeout=60)
    assert r.status_code == 400 and says in r.json()["error"]


def test_a_3000_term_expression_is_scored_and_the_server_goes_on(server):
    terms = PROMPT + "<step>" + "+".join(["2"] * 3000) + " = 6000</step><answer>19</answer>"
    r = httpx.post(f"{server}/get_reward", json={"query": [terms, RIGHT], "prompts": [PROMPT] * 2, "labels": ["19"] * 2}, timeout=60)
    assert r.status_code == 200
    assert r.json()["scores"] == [1.0, 1.0] and r.json()["extra_logs"]["checked_steps"] == [0.0, 1.0]
