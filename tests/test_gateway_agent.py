"""An external agent does a terminal task through a real `tentalis serve` (tiny random model) with the
official openai client and tool calls: its episode lands as session turns (exact token ids, log-probs),
its verdict as the session's review, and a sessions batch cut from it builds multi_turn rollouts and
trajectories of the shape an environment batch's episode has (assistant-only mask, log-probs on the
sampled tokens only, the verdict as the reward)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest

from tentalis_pipelines import sessions
from tentalis_pipelines.envs.gateway_policy import TOOLS, run_gateway_episode
from tentalis_pipelines.envs.terminal import TerminalConfig, TerminalEnv
from tentalis_pipelines.envs.terminal_tasks import generate_tasks
from tentalis_pipelines.envs.verdicts import verdict_review
from tentalis_pipelines.lakehouse import Lakehouse
from tentalis_pipelines.settings import Paths
from tests.local_servers import free_port

needs_sandbox = pytest.mark.skipif(not sys.platform.startswith("linux") or os.geteuid() != 0,
                                   reason="the sandbox needs Linux namespaces and root (CI runs as root)")


def serve(home: Path, model_dir: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = open(home / "serve.log", "ab")  # noqa: SIM115 - the server's log, closed with the process
    proc = subprocess.Popen([sys.executable, "-m", "tentalis_pipelines.cli", "serve", "--port", str(port), "--model", str(model_dir),
                             "--no-auth", "--device", "cpu", "--dtype", "float32", "--flush-interval", "0.5", "--poll-seconds", "0"],
                            env={**os.environ, "TENTALIS_HOME": str(home)}, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 600  # a model load on a busy 2-core host: readiness, not speed
    while time.monotonic() < deadline:
        assert proc.poll() is None, (home / "serve.log").read_text()[-3000:]
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    proc.terminate()
    raise TimeoutError((home / "serve.log").read_text()[-3000:])


def wait_flushed(url: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if httpx.get(url + "/health", timeout=10).json()["wal_pending"] == 0:
            return
        time.sleep(0.1)
    raise TimeoutError("the gateway did not flush its WAL")


@needs_sandbox
def test_an_agent_through_the_gateway_lands_an_episode_that_trains_like_a_batch_episode(tmp_path, tiny_model_dir, monkeypatch):
    monkeypatch.setenv("TENTALIS_DATA_DIR", os.environ.get("TENTALIS_DATA_DIR", "/work/shared/data"))
    paths = Paths.from_env(str(tmp_path / "home")).ensure()
    proc, url = serve(paths.home, tiny_model_dir)
    try:
        client = openai.OpenAI(base_url=url + "/v1", api_key="local", max_retries=0)
        model = client.models.list().data[0].id
        task = [t for t in generate_tasks(32, levels=(1,)) if t.split == "train"][0]
        ep = run_gateway_episode(client, model, TerminalEnv(TerminalConfig(max_turns=2)), task, session_id="gw-ep-1",
                                 max_tokens=8, temperature=1.0, seed=1)
        wait_flushed(url)
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    assert ep.turns_used == 2 and not ep.passed  # a random model solves nothing: two turns, the limit
    lake = Lakehouse(paths.lakehouse)
    turns = sorted((t for t in lake.read("turns").to_pylist() if t["session_id"] == "gw-ep-1"), key=lambda t: t["turn_index"])
    assert [t["turn_index"] for t in turns] == [0, 1] and {t["tenant"] for t in turns} == {"local"}
    for t, turn in zip(turns, ep.turns):  # the gateway landed exactly what the agent got back
        assert t["completion_token_ids"] == turn.token_ids and len(turn.token_ids) >= 1
        assert t["prompt_token_ids"] == turn.prompt_token_ids
        assert t["sampling_logprobs"] == pytest.approx(turn.logprobs, abs=1e-5) and len(turn.logprobs) == len(turn.token_ids)
        assert json.loads(t["tools"]) == TOOLS and t["temperature"] == 1.0
    sent = json.loads(turns[1]["messages"])
    assert sent[0]["role"] == "system" and sent[0]["content"] == ep.messages[0]["content"]
    assert any(m["role"] == "user" and m["content"] == task.instruction for m in sent)
    assert sent[-1]["content"] == ep.messages[-2]["content"]  # the observation of turn 0 (a user message or a tool result)
    [review] = [r for r in lake.read("reviews").to_pylist() if r["session_id"] == "gw-ep-1"]
    expected = verdict_review(passed=ep.passed, reward=ep.reward, detail=ep.verdict.detail, end_reason=ep.end_reason,
                              check_kind=task.kind, format_errors=sum(t.action is None for t in ep.turns), turns=2, max_turns=2)
    assert (review["batch_id"], review["rollout_id"], review["manager"]) == ("live", "gw-ep-1", "verifier")
    assert (review["score"], review["critique"], review["hint"]) == (expected["score"], expected["critique"], expected["hint"])

    # Cut into a sessions batch, the episode trains like an environment batch's episode.
    sb = sessions.register_sessions_batch(paths.batches, ["gw-ep-1"])
    sessions.build_session_tasks(lake, paths.batches, sb)
    sessions.build_session_rollouts(lake, sb)
    sessions.build_session_reviews(lake, sb)
    sessions.build_session_trajectories(lake, sb)
    rollouts = lake.read("rollouts", batch_id=sb).to_pylist()
    trajectories = {t["rollout_id"]: t for t in lake.read("trajectories", batch_id=sb).to_pylist()}
    spans = [s for r in rollouts for s in r["turn_spans"]]
    assert sorted(s["turn_index"] for s in spans) == [0, 1]  # both turns train, in one or two segments
    for r in rollouts:
        mask, lps, ids = r["assistant_mask"], r["sampling_logprobs"], r["completion_token_ids"]
        covered = {i for s in r["turn_spans"] for i in range(s["start"], s["end"])}
        assert [i for i, m in enumerate(mask) if m] == sorted(covered) and len(mask) == len(ids)
        assert all((x is None) != bool(m) for x, m in zip(lps, mask))  # log-probs on the sampled tokens only
        t = trajectories[r["rollout_id"]]
        assert t["kind"] == "multi_turn" and t["loss_mask"] == mask and t["reward"] == review["score"]
    by_turn = {s["turn_index"]: (r, s) for r in rollouts for s in r["turn_spans"]}
    for k, turn in enumerate(ep.turns):
        r, s = by_turn[k]
        assert r["completion_token_ids"][s["start"]:s["end"]] == turn.token_ids
