"""Manager reviews and step scores of terminal episodes on a real lakehouse: scripted episodes in the real
sandbox, landed as an environment batch's rollouts, then the step_scores and reviews stages; the llm
manager is the tiny random model (the same LLMManager and transformers backend a task batch uses)."""

from __future__ import annotations

import json
import os
import sys

import pytest

from tentalis_pipelines import env_batches
from tentalis_pipelines.envs import verdicts
from tentalis_pipelines.envs.agents import bash_block, raw_agent
from tentalis_pipelines.envs.runner import run_episode
from tentalis_pipelines.envs.terminal import TerminalConfig, TerminalEnv
from tentalis_pipelines.envs.terminal_tasks import TerminalTask
from tentalis_pipelines.lakehouse import Lakehouse, now_utc
from tentalis_pipelines.stages.reviews import build_reviews
from tentalis_pipelines.stages.step_scores import build_step_scores

needs_sandbox = pytest.mark.skipif(not sys.platform.startswith("linux") or os.geteuid() != 0,
                                   reason="the sandbox needs Linux namespaces and root (CI runs as root)")

TASK = TerminalTask(task_id="t-count", level=1, family="test", instruction="How many lines are in a.txt?",
                    tree={"a.txt": "one\ntwo\n"}, check={"kind": "answer", "expected": "2"}, solution=["submit 2"])
BID = "terminal-s1-n1-l1"


def _batch(tmp_path):
    """One task, two scripted episodes: one passes (after a failing command and a format error), one fails."""
    good = raw_agent([bash_block("wc -l < a.txt"), bash_block("ls missing"), "It has two lines.", bash_block("submit 2")])
    bad = raw_agent([bash_block("submit 3")])
    episodes = [run_episode(TerminalEnv(TerminalConfig(max_turns=6)), TASK, agent) for agent in (good, bad)]
    lake = Lakehouse(tmp_path / "lake")
    lake.write_batch("tasks", BID, [{**TASK.task_row(), "batch_id": BID, "created_at": now_utc()}])
    rows = []
    for g, ep in enumerate(episodes):
        rows += env_batches.episode_rollout_rows(BID, TASK, g, ep, policy_version="base", model="m", temperature=0.0,
                                                 max_tokens=None, created_at=now_utc())
    lake.write_batch("rollouts", BID, rows)
    return lake, episodes, {r["group_index"]: r["session_id"] for r in rows}


@needs_sandbox
def test_step_scores_of_a_scripted_terminal_episode_by_hand(tmp_path):
    lake, episodes, ids = _batch(tmp_path)
    assert [ep.passed for ep in episodes] == [True, False]
    res = build_step_scores(lake, BID, scorer="calculator")  # the configured scorer does not apply to episodes
    assert res.metadata["scorer"] == "environment" and res.metadata["scored_steps"] == 5
    rows = {(r["rollout_id"], r["step_index"]): r for r in lake.read("step_scores", batch_id=BID).to_pylist()}
    good, bad = ids[0], ids[1]
    assert [(rows[(good, i)]["score"], rows[(good, i)]["rationale"]) for i in range(4)] == [
        (1.0, "exit status 0"), (0.0, "exit status 2"), (0.0, rows[(good, 2)]["rationale"]), (1.0, "exit status 0")]
    assert rows[(good, 2)]["rationale"].startswith("format error: ") and rows[(good, 2)]["votes"] == [0.0]
    assert rows[(good, 0)]["step_text"] == "wc -l < a.txt" and rows[(good, 2)]["step_text"] == "It has two lines."
    assert (rows[(bad, 0)]["score"], rows[(bad, 0)]["step_text"]) == (1.0, "submit 3") and len(rows) == 5
    assert res.metadata["mean_step_score"] == pytest.approx(3 / 5)


def _manager(model_dir):
    from tentalis_pipelines.inference.factory import make_backend
    from tentalis_pipelines.rewards.llm_manager import LLMManager

    return LLMManager(make_backend("transformers", model_dir=model_dir), max_new_tokens=16)


@needs_sandbox
def test_a_verifier_batch_is_unchanged_and_an_llm_batch_keeps_the_verifiers_score(tmp_path, tiny_model_dir):
    lake, episodes, ids = _batch(tmp_path)
    build_reviews(lake, BID, "verifier", llm_manager=lambda: pytest.fail("the verifier needs no model"))
    verifier = {r["rollout_id"]: r for r in lake.read("reviews", batch_id=BID).to_pylist()}
    # The tiny random model closes the critique at once (greedy ' "'): the verdict's words stand in, marked.
    res = build_reviews(lake, BID, "llm", llm_manager=lambda: _manager(tiny_model_dir))
    llm = {r["rollout_id"]: r for r in lake.read("reviews", batch_id=BID).to_pylist()}
    assert (res.metadata["manager"], res.metadata["reviewer"], res.rows) == ("llm", "llm-manager:base", 2)
    for g, ep in enumerate(episodes):
        v, m = verifier[ids[g]], llm[ids[g]]
        assert (v["manager"], v["reviewer"], v["score"]) == ("verifier", "verifier", ep.reward)
        assert v["critique"] == (f"passed (submitted) after 4 of 6 turns, 1 without a command: {ep.verdict.detail}" if g == 0
                                 else f"failed (submitted) after 1 of 6 turns: {ep.verdict.detail}")
        assert v["hint"] == ("" if g == 0 else verdicts.HINTS["wrong_answer"])
        assert (m["manager"], m["reviewer"], m["score"]) == ("llm", "llm-manager:base", ep.reward)
        assert m["critique"] == f"(the manager wrote no critique; the verifier's) {v['critique']}" and m["hint"] == v["hint"]


@needs_sandbox
def test_the_llm_manager_writes_the_critique_and_hint_of_each_episode(tmp_path, embedded_model_dir):
    lake, episodes, ids = _batch(tmp_path)
    manager = _manager(embedded_model_dir)
    build_reviews(lake, BID, "llm", llm_manager=lambda: manager)
    llm = {r["rollout_id"]: r for r in lake.read("reviews", batch_id=BID).to_pylist()}
    records = {r["session_id"]: json.loads(r["episode"]) for r in lake.read("rollouts", batch_id=BID).to_pylist()}
    expected = manager.review_episodes([(env_batches.review_transcript(records[ids[g]]), float(g == 0)) for g in (0, 1)])
    for g, ep in enumerate(episodes):
        m = llm[ids[g]]
        assert (m["manager"], m["reviewer"], m["score"]) == ("llm", "llm-manager:base", ep.reward)
        assert m["critique"] and m["hint"] and (m["critique"], m["hint"]) == expected[g], (m["critique"], m["hint"])
