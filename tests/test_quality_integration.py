"""Data-quality checks: each passes on sound data and fails on a planted defect (hand-made rows)."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pytest

from tentalis_pipelines import quality
from tentalis_pipelines.evaluation.benchmarks import load_benchmark
from tentalis_pipelines.lakehouse import Lakehouse
from tentalis_pipelines.settings import Paths
from tentalis_pipelines.stages.tasks import build_tasks
from tentalis_pipelines.tasks.batches import register_file_batch

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


def test_no_held_out_items_fails_on_a_gate_item_even_reformatted(lake):
    held = load_benchmark("arithmetic")[1][0]
    lake.write_batch("tasks", "b1", [_task("t0", "What is 12 + 30?")])
    assert quality.no_held_out_items(lake, "b1").passed
    lake.write_batch("tasks", "b1", [_task("t0", "What is 12 + 30?"), _task("t1", "  " + held.prompt.upper() + " ")])
    out = quality.no_held_out_items(lake, "b1")
    assert not out.passed and f"t1 = arithmetic/{held.item_id}" in out.description and out.metadata["contaminated"] == 1


def test_a_held_out_item_in_a_task_file_is_quarantined_not_trained_on(home):
    """Fail closed: the contaminated line goes to quarantine naming the item; the rest of the file runs."""
    paths = Paths.from_env(home).ensure()
    held = load_benchmark("arithmetic")[1][3]
    src = paths.inbox / "mixed.jsonl"
    src.write_text(json.dumps({"prompt": held.prompt, "reference": held.reference}) + "\n"
                   + json.dumps({"prompt": "What is 2 + 2?", "reference": "4"}) + "\n")
    batch_id = register_file_batch(paths.batches, src)
    lake = Lakehouse(paths.lakehouse)
    build_tasks(lake, paths, batch_id)
    assert [t["prompt"] for t in lake.read("tasks").to_pylist()] == ["What is 2 + 2?"]
    (q,) = lake.read("quarantine").to_pylist()
    assert f"arithmetic/{held.item_id}" in q["error"] and "contaminate" in q["error"]
    assert quality.no_held_out_items(lake, batch_id).passed
