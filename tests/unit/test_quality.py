"""Data-quality checks: each passes on sound data and fails on a planted defect (hand-made rows)."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from tentalis_pipelines import quality
from tentalis_pipelines.lakehouse import Lakehouse
from tentalis_pipelines.stages import kinds

NOW = datetime.now(timezone.utc)


def _task(tid: str, prompt: str) -> dict:
    return {"batch_id": "b1", "task_id": tid, "source": "s", "environment": "math", "prompt": prompt, "reference": "1",
            "difficulty": 1, "metadata": "{}", "created_at": NOW}


def _rollout(rid: str, tid: str) -> dict:
    return {"batch_id": "b1", "rollout_id": rid, "task_id": tid, "group_index": 0, "policy_version": "base", "backend": "x",
            "model": "m", "prompt_text": "p", "completion": "c", "steps": [], "answer": "1", "parse_mode": "tagged",
            "prompt_tokens": 1, "completion_tokens": 1, "completion_token_ids": [1], "sampling_logprobs": None,
            "finish_reason": "stop", "temperature": 0.8, "seconds": 0.1, "created_at": NOW}


def _trajectory(rid: str, **over) -> dict:
    row = {"batch_id": "b1", "rollout_id": rid, "task_id": "t0", "group_index": 0, "policy_version": "base",
           "outcome_reward": 1.0, "format_reward": 1.0, "process_reward": None, "step_rewards": [], "manager_score": 0.5,
           "overlong_penalty": 0.0, "reward": 1.2, "reward_weights": "{}", "advantage": 0.7, "step_advantages": [0.1],
           "advantage_mode": "outcome", "kept": True, "created_at": NOW}
    return {**row, **over}


@pytest.fixture()
def lake(tmp_path):
    return Lakehouse(tmp_path / "lake")




def test_rollouts_per_task_needs_exactly_g(lake):
    lake.write_batch("tasks", "b1", [_task("t0", "a"), _task("t1", "b")])
    lake.write_batch("rollouts", "b1", [_rollout(f"r{i}", f"t{i // 2}") for i in range(4)])
    assert kinds.rollouts_per_task(lake, "b1", 2).passed
    lake.write_batch("rollouts", "b1", [_rollout(f"r{i}", "t0") for i in range(3)])
    out = kinds.rollouts_per_task(lake, "b1", 2)
    assert not out.passed and out.metadata["wrong"] == 2  # t0 has 3, t1 has none


def test_one_review_per_rollout_sees_missing_doubled_and_orphan_reviews(lake):
    lake.write_batch("rollouts", "b1", [_rollout("r0", "t0"), _rollout("r1", "t0")])
    review = {"batch_id": "b1", "manager": "verifier", "score": 1.0, "critique": "", "hint": "", "created_at": NOW}
    lake.write_batch("reviews", "b1", [{**review, "rollout_id": "r0"}, {**review, "rollout_id": "r1"}])
    assert kinds.one_review_per_rollout(lake, "b1").passed
    lake.write_batch("reviews", "b1", [{**review, "rollout_id": "r0"}, {**review, "rollout_id": "r0"}, {**review, "rollout_id": "rX"}])
    out = kinds.one_review_per_rollout(lake, "b1")
    assert not out.passed and out.metadata == {"missing": 1, "doubled": 1, "orphans": 1}


@pytest.mark.parametrize("defect", [{"reward": float("nan")}, {"advantage": float("inf")}, {"manager_score": 1.5},
                                    {"outcome_reward": -0.1}, {"step_advantages": [0.0, float("nan")]}])
def test_rewards_in_range_fails_on_each_kind_of_bad_value(lake, defect):
    lake.write_batch("trajectories", "b1", [_trajectory("r0")])
    assert quality.rewards_in_range(lake, "b1").passed
    lake.write_batch("trajectories", "b1", [_trajectory("r0"), _trajectory("r1", **defect)])
    out = quality.rewards_in_range(lake, "b1")
    assert not out.passed and "r1." in out.description and out.metadata["bad"] == 1


