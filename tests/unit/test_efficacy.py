"""Hint efficacy against hand-built tables: families, hint kinds, before/after success and the interval."""

from __future__ import annotations

import json

import pytest

from tentalis_pipelines import efficacy
from tentalis_pipelines.lakehouse import Lakehouse, now_utc
from tentalis_pipelines.rewards.managers import plan_hint, wrong_step_hint
from tentalis_pipelines.stages.hint_efficacy import build_hint_efficacy


def _task(batch, tid, expr):
    return {"batch_id": batch, "task_id": tid, "metadata": json.dumps({"expression": expr}), "environment": "math",
            "source": "generator:arithmetic", "prompt": "q", "reference": "1", "difficulty": 1, "created_at": now_utc()}


def test_families_and_hint_kinds():
    assert efficacy.task_family(_task("b", "t", "12 - 7")) == "subtract"
    assert efficacy.task_family(_task("b", "t", "4 * 6 + 3")) == "multiply+add"
    assert efficacy.task_family({"metadata": json.dumps({"family": "fam-abc"})}) == "fam-abc"
    assert efficacy.task_family({"metadata": "{}", "environment": "math", "source": "/x/gsm8k.jsonl"}) == "math:/x/gsm8k.jsonl"
    assert efficacy.hint_kind(wrong_step_hint(2, "12 + 7 = 18 is wrong (it is 19)")) == "wrong_step"
    assert efficacy.hint_kind(plan_hint("12 + 7")) == "plan"
    assert efficacy.hint_kind("Finish with the final number inside <answer></answer>.") == "finish_with_answer"
    assert efficacy.hint_kind("Write each step in <step></step> and only the final number in <answer></answer>.") == "format"
    assert efficacy.hint_kind("Be more concise with units.") == "free_text"
    assert efficacy.hint_kind("") == "none"


def test_before_and_after_success_of_the_hinted_family(tmp_path):
    lake = Lakehouse(tmp_path / "lake")
    now = now_utc()
    tasks = [_task("b1", "sub", "12 - 7"), _task("b1", "add", "3 + 4"), _task("b2", "sub2", "9 - 2")]
    traj, reviews = [], []

    def roll(batch, rid, task, policy, ok, hint=""):
        traj.append({"batch_id": batch, "rollout_id": rid, "task_id": task, "policy_version": policy, "outcome_reward": 1.0 if ok else 0.0})
        reviews.append({"batch_id": batch, "rollout_id": rid, "manager": "verifier", "hint": hint})

    # base on subtraction: 1 of 4 right; the 3 failures carry a plan hint. Addition: 2 of 2 right, no hints.
    for i, ok in enumerate([True, False, False, False]):
        roll("b1", f"s{i}", "sub", "base", ok, "" if ok else plan_hint("12 - 7"))
    roll("b1", "a0", "add", "base", True)
    roll("b1", "a1", "add", "base", True)
    # the checkpoint c1 (trained on b1) on subtraction: 3 of 4 right
    for i, ok in enumerate([True, True, True, False]):
        roll("b2", f"c{i}", "sub2", "c1", ok, "" if ok else wrong_step_hint(1, "9 - 2 = 6 is wrong (it is 7)"))
    ckpts = [{"checkpoint_id": "c1", "parent_id": None, "trajectory_ids": ["s0", "s1", "s2", "s3", "a0", "a1"]}]
    rows = efficacy.hint_efficacy(ckpts, traj, reviews, tasks, [{"rollout_id": "s1", "decision": "used"}])
    assert len(rows) == 1  # only the hinted family; addition had no hinted failure
    r = rows[0]
    assert (r["checkpoint_id"], r["manager"], r["hint_kind"], r["family"]) == ("c1", "verifier", "plan", "subtract")
    assert (r["hinted_failures"], r["distilled"], r["before_policy"]) == (3, 1, "base")
    assert (r["before_n"], r["before_success"], r["after_n"], r["after_success"]) == (4, 0.25, 4, 0.75)
    assert r["delta"] == pytest.approx(0.5)
    # Newcombe's interval by hand: Wilson(1/4) = [0.0456, 0.6994], Wilson(3/4) = [0.3006, 0.9544]
    assert r["delta_ci_low"] == pytest.approx(0.5 - ((0.75 - 0.3006) ** 2 + (0.6994 - 0.25) ** 2) ** 0.5, abs=1e-3)
    assert r["delta_ci_high"] == pytest.approx(0.5 + ((0.9544 - 0.75) ** 2 + (0.25 - 0.0456) ** 2) ** 0.5, abs=1e-3)
    assert r["delta_ci_low"] < 0 < r["delta_ci_high"]  # 4 vs 4 samples: a hint, not proof

    # Through the lakehouse: the stage writes the same row.
    lake.write_batch("tasks", "b1", [t for t in tasks if t["batch_id"] == "b1"])
    lake.write_batch("tasks", "b2", [t for t in tasks if t["batch_id"] == "b2"])
    res = build_hint_efficacy_from(lake, ckpts, traj, reviews, now)
    assert res.rows == 1 and lake.read("hint_efficacy").to_pylist()[0]["delta"] == pytest.approx(0.5)


def build_hint_efficacy_from(lake, ckpts, traj, reviews, now):
    for b in ("b1", "b2"):
        lake.write_batch("trajectories", b, [{**t, "group_index": 0, "format_reward": 0.0, "process_reward": None, "step_rewards": [],
                                              "manager_score": 0.0, "overlong_penalty": 0.0, "reward": t["outcome_reward"],
                                              "reward_weights": "{}", "advantage": 0.0, "step_advantages": [], "advantage_mode": "outcome",
                                              "kept": True, "created_at": now} for t in traj if t["batch_id"] == b])
        lake.write_batch("reviews", b, [{**r, "score": 0.0, "critique": "", "created_at": now} for r in reviews if r["batch_id"] == b])
    lake.append("checkpoints", [{**c, "base_model": "m", "adapter_uri": "/x", "algorithm": "dapo", "config": "{}", "trained_on": ["b1"],
                                 "trajectory_count": 6, "metrics": "{}", "promoted": True, "created_at": now} for c in ckpts])
    return build_hint_efficacy(lake)
