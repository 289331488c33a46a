"""The order of a cycle's runs (``jobs.runner.run_cycle``); the jobs themselves are tested with their assets.

Here each job run is replaced by what it writes to the lakehouse, so what is under test is only the
orchestration: which partitions the cycle asks for, and when."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest
from dagster import AssetMaterialization, DagsterInstance

import jobs.runner as runner
from tentalis_pipelines import promotion
from tentalis_pipelines.definitions import defs
from tentalis_pipelines.lakehouse import Lakehouse
from tentalis_pipelines.settings import Paths
from tentalis_pipelines.training import checkpoints as ckpt
from tentalis_pipelines.training.trainer import GRPOConfig, build_policy

NOW = datetime.now(timezone.utc)


def _measure(lake: Lakehouse, cid: str, n_correct: int, skill_ids: tuple[str, ...]) -> None:
    key = {"checkpoint_id": cid, "benchmark": "arithmetic"}
    lake.replace_where("benchmark_items", key, [
        {**key, "item_id": f"i{k}", "prompt": "p", "completion": "c", "extracted_answer": "1", "reference": "1", "correct": k < n_correct,
         "lenient_correct": k < n_correct, "formatted": True, "created_at": NOW, "skill_ids": list(skill_ids)} for k in range(40)])
    lake.replace_where("benchmark_results", key, [{**key, "n": 40, "accuracy": n_correct / 40, "created_at": NOW}])


def test_a_cycle_measures_an_incumbent_measured_with_other_skills_again_before_the_gate(home, tiny_model_dir, monkeypatch):
    """The base was measured while skill sk-1 was verified (30 of 40 right); it was retired since, so the
    candidate is measured without it (8 of 40), as the base would be (8 of 40). The cycle benchmarks the
    candidate, finds the base's results stale, benchmarks the base again, and only then runs the gate."""
    paths = Paths.from_env(str(home)).ensure()
    lake = Lakehouse(paths.lakehouse)
    _measure(lake, "base", 30, ("sk-1",))
    calls: list[tuple[str, str | None]] = []

    def run_job(defs, instance, name, *, partition_key=None, run_config=None, tags=None):
        ref = partition_key.keys_by_dimension["checkpoint"] if name == "benchmark_job" else None
        calls.append((name, ref))
        if name == "train_job":
            adapter = ckpt.save_adapter(build_policy(tiny_model_dir, None, GRPOConfig()), paths.checkpoints, "ck1")
            ckpt.record_checkpoint(lake, {"checkpoint_id": "ck1", "parent_id": None, "base_model": "tiny", "adapter_uri": str(adapter),
                                          "algorithm": "grpo", "config": {}, "trained_on": [], "trajectory_ids": [],
                                          "trajectory_count": 0, "metrics": {}, "promoted": False})
        elif name == "benchmark_job":
            _measure(lake, ref, 8, ())  # today's verified skill set is empty, for every checkpoint
        elif name == "promotion_job":
            promotion.decide_promotion(lake, run_config["ops"]["serving"]["config"]["checkpoint_id"], "arithmetic")
        return runner.JobRun(name, f"run-{len(calls)}", str(partition_key) if partition_key else None, 0.0)

    monkeypatch.setattr(runner, "run_job", run_job)
    monkeypatch.setattr(runner, "fresh_trajectory_count", lambda lake, paths: 1)  # the fake rollouts write no trajectories
    opts = runner.CycleOptions(num_tasks=2, seed=1, levels=(1,), resources={
        "benchmark": {"config": {"benchmarks": ["arithmetic"], "gate_benchmark": "arithmetic"}}, "trainer": {"config": {"promotion": "gate"}}})
    with DagsterInstance.ephemeral() as instance:
        out = runner.run_cycle(defs, instance, paths, opts)
    assert calls == [("rollout_job", None), ("train_job", None), ("benchmark_job", "ck1"), ("benchmark_job", "base"), ("promotion_job", None)]
    decision = out["decision"]
    # Like with like: 8 vs 8 on the same 40 items, promoted; compared as first recorded it was 8 vs 30, rejected.
    assert (decision["incumbent"], decision["n_paired"], decision["diff"], decision["promote"]) == ("base", 40, 0.0, True)


def test_a_cycle_resumes_the_batch_an_interrupted_cycle_left(home, tiny_model_dir, monkeypatch):
    """Cycle 1 is killed in its rollouts; cycle 2 runs that same batch (arith-s1) instead of registering
    arith-s2, and cycle 3, with arith-s1 trained on, moves on to arith-s2. A batch whose trajectories were
    materialized with no rows is settled too, so it is never retried forever."""
    paths = Paths.from_env(str(home)).ensure()
    lake = Lakehouse(paths.lakehouse)
    calls: list[tuple[str, str | None]] = []
    killed = {"rollout": True}

    def run_job(defs, instance, name, *, partition_key=None, run_config=None, tags=None):
        calls.append((name, str(partition_key) if partition_key else None))
        if name == "rollout_job" and killed.pop("rollout", False):
            raise KeyboardInterrupt  # the process dies mid-rollouts: nothing after this runs
        if name == "train_job":
            batch = next(p for n, p in reversed(calls) if n == "rollout_job")
            cid = f"ck-{batch}"
            adapter = ckpt.save_adapter(build_policy(tiny_model_dir, None, GRPOConfig()), paths.checkpoints, cid)
            ckpt.record_checkpoint(lake, {"checkpoint_id": cid, "parent_id": None, "base_model": "tiny", "adapter_uri": str(adapter),
                                          "algorithm": "grpo", "config": {}, "trained_on": [batch], "trajectory_ids": [],
                                          "trajectory_count": 0, "metrics": {}, "promoted": False})
        return runner.JobRun(name, f"run-{len(calls)}", str(partition_key) if partition_key else None, 0.0)

    monkeypatch.setattr(runner, "run_job", run_job)
    monkeypatch.setattr(runner, "fresh_trajectory_count", lambda lake, paths: 1)  # the fake rollouts write no trajectories
    opts = runner.CycleOptions(num_tasks=2, levels=(1,), resources={"trainer": {"config": {"promotion": "always"}}})
    notes: list[str] = []
    with DagsterInstance.ephemeral() as instance:
        with pytest.raises(KeyboardInterrupt):
            runner.run_cycle(defs, instance, paths, opts)
        second = runner.run_cycle(defs, instance, paths, opts, on_note=notes.append)
        third = runner.run_cycle(defs, instance, paths, opts, on_note=notes.append)
        # arith-s3's rollouts ran and materialized trajectories with no rows, then training failed.
        instance.add_dynamic_partitions("task_batches", ["arith-s3-n2-l1"])
        runner.register_generated_batch(paths.batches, seed=3, num_tasks=2, levels=(1,))
        instance.report_runless_asset_event(AssetMaterialization("trajectories", partition="arith-s3-n2-l1"))
        fourth = runner.run_cycle(defs, instance, paths, opts, on_note=notes.append)
    assert [second["batch_id"], third["batch_id"], fourth["batch_id"]] == ["arith-s1-n2-l1", "arith-s2-n2-l1", "arith-s4-n2-l1"]
    assert [second["resumed"], third["resumed"], fourth["resumed"]] == [True, False, False]
    assert [p for n, p in calls if n == "rollout_job"] == ["arith-s1-n2-l1", "arith-s1-n2-l1", "arith-s2-n2-l1", "arith-s4-n2-l1"]
    assert notes == ["resuming arith-s1-n2-l1: an interrupted cycle registered it and wrote no trajectories"]
    # A fresh instance (its run history lost) still sees what the lakehouse holds: trained-on batches and
    # batches with trajectory rows; arith-s3, materialized with no rows in the old instance only, is not.
    lake.write_batch("trajectories", "arith-s5-n2-l1", [
        {"batch_id": "arith-s5-n2-l1", "rollout_id": "r0", "task_id": "t", "group_index": 0, "policy_version": "base",
         "outcome_reward": 1.0, "format_reward": 0.0, "process_reward": None, "step_rewards": [], "manager_score": 0.0,
         "overlong_penalty": 0.0, "reward": 1.0, "reward_weights": "{}", "advantage": 0.0, "step_advantages": [],
         "advantage_mode": "outcome", "kept": True, "created_at": NOW}])
    with DagsterInstance.ephemeral() as fresh:
        assert runner.settled_batches(lake, fresh) == {"arith-s1-n2-l1", "arith-s2-n2-l1", "arith-s4-n2-l1", "arith-s5-n2-l1"}


def _trajectory(batch_id: str, rollout_id: str, reward: float, kept: bool) -> dict:
    return {"batch_id": batch_id, "rollout_id": rollout_id, "task_id": "t", "group_index": 0, "policy_version": "base",
            "outcome_reward": reward, "format_reward": 0.0, "process_reward": None, "step_rewards": [], "manager_score": 0.0,
            "overlong_penalty": 0.0, "reward": reward, "reward_weights": "{}", "advantage": 0.0, "step_advantages": [],
            "advantage_mode": "outcome", "kept": kept, "created_at": NOW}


def test_a_cycle_whose_batch_has_no_learning_signal_trains_nothing_and_says_why(home, monkeypatch):
    """A saturated policy passes every sample of every task: every group's rewards are equal, no trajectory
    is kept, and the cycle skips training (no train_job, no checkpoint, no benchmark) with a note instead of
    failing; the next batch with one kept trajectory trains again."""
    paths = Paths.from_env(str(home)).ensure()
    lake = Lakehouse(paths.lakehouse)
    calls: list[str] = []
    kept = iter([False, True])

    def run_job(defs, instance, name, *, partition_key=None, run_config=None, tags=None):
        calls.append(name)
        if name == "rollout_job":
            batch, k = str(partition_key), next(kept)
            lake.write_batch("trajectories", batch, [_trajectory(batch, f"{batch}-r{i}", 1.0 if not k else float(i), k or False)
                                                     for i in range(4)])
        if name == "train_job":
            raise RuntimeError("trained")  # reached only when the batch has a signal
        return runner.JobRun(name, f"run-{len(calls)}", str(partition_key) if partition_key else None, 0.0)

    monkeypatch.setattr(runner, "run_job", run_job)
    opts = runner.CycleOptions(num_tasks=2, levels=(1,))
    notes: list[str] = []
    with DagsterInstance.ephemeral() as instance:
        out = runner.run_cycle(defs, instance, paths, opts, on_note=notes.append)
        assert calls == ["rollout_job"] and out["checkpoint_id"] is None
        assert out["skipped"] == notes[0]
        assert notes[0].startswith("arith-s1-n2-l1: nothing to train on, no checkpoint this cycle: none of its 4 trajectories carries")
        assert "mean reward 1.00" in notes[0] and "harder tasks (--levels)" in notes[0]
        with pytest.raises(RuntimeError, match="trained"):
            runner.run_cycle(defs, instance, paths, opts, on_note=notes.append)
    assert calls == ["rollout_job", "rollout_job", "train_job"] and len(notes) == 1
