"""A terminal batch through rollout_job and train_job on the tiny random model, with real sandbox episodes.

2 tasks x 2 episodes, at most 2 turns of 12 tokens each. The random model never solves a task, so the
terminal verifier is replaced by one that passes every other episode it judges (the first of each task's
pair): each task's group then carries a learning signal and the batch trains. Everything else is real:
the sandbox, ChatPolicy, the stages, the checks, the trainer."""

from __future__ import annotations

import json
import os
import sys

import pytest
from dagster import DagsterInstance

import jobs.runner as runner
from tentalis_pipelines.definitions import defs
from tentalis_pipelines.envs import terminal
from tentalis_pipelines.envs.base import Verdict
from tentalis_pipelines.lakehouse import Lakehouse
from tentalis_pipelines.settings import Paths

needs_sandbox = pytest.mark.skipif(not sys.platform.startswith("linux") or os.geteuid() != 0,
                                   reason="the sandbox needs Linux namespaces and root (CI runs as root)")


@needs_sandbox
def test_a_terminal_batch_lands_episodes_reviews_and_multi_turn_trajectories_and_trains(home, tiny_model_dir, monkeypatch):
    monkeypatch.delenv("TENTALIS_MODEL", raising=False)
    judged = []

    def alternate(task, answer, tree):
        judged.append(task.task_id)
        return Verdict(True, 1.0, "stub: passed") if len(judged) % 2 == 1 else Verdict(False, 0.0, "stub: failed")

    monkeypatch.setattr(terminal, "verify", alternate)
    paths = Paths.from_env(str(home)).ensure()
    lake = Lakehouse(paths.lakehouse)
    config = {"resources": {"policy": {"config": {"model": str(tiny_model_dir), "num_generations": 2, "max_new_tokens": 12}}},
              "loggers": {"console": {"config": {"log_level": "CRITICAL"}}}}
    with DagsterInstance.ephemeral() as instance:
        # The sampling recipe is the batch's (its manifest), not the policy resource's run config.
        batch_id = runner.register_batch(instance, paths, num_tasks=2, seed=None, levels=(1,), task_source="terminal", max_turns=2,
                                         recipe={"temperature": 1.0, "max_new_tokens": 12})
        assert batch_id == "terminal-s1-n2-l1"
        runner.run_job(defs, instance, "rollout_job", partition_key=batch_id, run_config=config)
        from dagster import AssetKey

        meta = instance.get_latest_materialization_event(AssetKey("rollouts")).asset_materialization.metadata
        decoding = meta["decoding"].value  # the cycle's run metadata holds the KV peak under its budget
        assert 0 < decoding["kv_peak_bytes"] <= decoding["kv_budget_bytes"] and decoding["prefill_tokens"] > 0
        before = {r["checkpoint_id"] for r in lake.read("checkpoints").to_pylist()} if lake.exists("checkpoints") else set()
        runner.run_job(defs, instance, "train_job", run_config=config)

    tasks = lake.read("tasks", batch_id=batch_id).to_pylist()
    assert len(tasks) == 2 and all(json.loads(t["metadata"])["split"] == "train" for t in tasks)
    rollouts = lake.read("rollouts", batch_id=batch_id).to_pylist()
    assert len(rollouts) == 4  # one segment per episode
    assert sorted((r["task_id"], r["group_index"]) for r in rollouts) == sorted((t["task_id"], g) for t in tasks for g in (0, 1))
    for r in rollouts:
        ep = json.loads(r["episode"])
        assert r["rollout_id"] == r["session_id"] and r["policy_version"] == "base" and r["temperature"] == 1.0
        assert 1 <= ep["turns"] <= 2 and ep["max_turns"] == 2 and r["parse_mode"] == f"episode:{ep['end_reason'].split(':')[0]}"
        spans, mask, ids = r["turn_spans"], r["assistant_mask"], r["completion_token_ids"]
        assert len(spans) == ep["turns"] and len(mask) == len(ids) == r["completion_tokens"]
        # The mask is exactly the generated tokens: each turn's span, and nothing between (observations).
        covered = {i for s in spans for i in range(s["start"], s["end"])}
        assert [i for i, m in enumerate(mask) if m] == sorted(covered)
        assert sum(mask) == sum(s["end"] - s["start"] for s in spans) and sum(s["end"] - s["start"] for s in spans) <= 12 * len(spans)
        if len(spans) == 2:  # the observation and the template tokens lie between the turns, masked out
            assert spans[1]["start"] > spans[0]["end"] and not any(mask[spans[0]["end"]:spans[1]["start"]])
        lps = r["sampling_logprobs"]
        assert len(lps) == len(ids) and all((x is None) != bool(m) for x, m in zip(lps, mask))
    assert len(judged) == 4 and any(len(r["turn_spans"]) == 2 for r in rollouts)  # real episodes, some of two turns
    reviews = {r["rollout_id"]: r for r in lake.read("reviews", batch_id=batch_id).to_pylist()}
    assert set(reviews) == {r["session_id"] for r in rollouts}
    for r in rollouts:
        ep, review = json.loads(r["episode"]), reviews[r["rollout_id"]]
        assert review["manager"] == "verifier" and review["score"] == ep["reward"] and ep["detail"] in review["critique"]
        assert (review["hint"] == "") == ep["passed"]
    assert sorted(reviews[r["rollout_id"]]["score"] for r in rollouts) == [0.0, 0.0, 1.0, 1.0]
    # One step score per turn (the environment's signal: exit status, or 0 for a turn without a command).
    steps = lake.read("step_scores", batch_id=batch_id).to_pylist()
    assert len(steps) == sum(json.loads(r["episode"])["turns"] for r in rollouts) and {s["scorer"] for s in steps} == {"environment"}
    trajectories = {r["rollout_id"]: r for r in lake.read("trajectories", batch_id=batch_id).to_pylist()}
    assert len(trajectories) == 4 and {t["kind"] for t in trajectories.values()} == {"multi_turn"}
    for r in rollouts:
        t = trajectories[r["rollout_id"]]
        assert t["loss_mask"] == r["assistant_mask"] and t["reward"] == reviews[r["rollout_id"]]["score"]
        assert (t["advantage"] > 0) == (t["reward"] == 1.0)  # each task: one passed, one failed episode
    checkpoints = lake.read("checkpoints").to_pylist()
    [new] = [c for c in checkpoints if c["checkpoint_id"] not in before]
    assert batch_id in new["trained_on"] and new["trajectory_count"] == 4


@needs_sandbox
def test_the_terminal_benchmark_runs_greedy_episodes_on_the_held_out_split(home, tiny_model_dir):
    from tentalis_pipelines.policy import PolicySettings
    from tentalis_pipelines.stages.evaluation import benchmark_checkpoint

    paths = Paths.from_env(str(home)).ensure()
    lake = Lakehouse(paths.lakehouse)
    res, summary = benchmark_checkpoint(lake, paths, PolicySettings(model=str(tiny_model_dir)), "base", "terminal", limit=3,
                                        max_new_tokens=8)
    assert (summary.benchmark, summary.n) == ("terminal", 3) and summary.accuracy == 0.0  # a random model solves nothing
    assert summary.ci_low == 0.0 and summary.ci_high == pytest.approx(0.5615, abs=1e-4)  # Wilson, 0 of 3
    per_level = res.metadata["success_per_level"]
    assert sum(v["n"] for v in per_level.values()) == 3 and all(v["success"] == 0.0 and v["ci_high"] > 0 for v in per_level.values())
    items = lake.read("benchmark_items").to_pylist()
    assert len(items) == 3 and all("-l" in i["item_id"] and not i["correct"] for i in items)
    assert all(int(i["item_id"].split("-")[3]) < 30 for i in items)  # the held-out split
