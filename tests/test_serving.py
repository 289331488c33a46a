"""The serving pointer: promotions and rollbacks move it (also back to older checkpoints), every move is
a row of `serving`, the next rollout follows it, and a missing adapter is an error, never a fallback."""

import threading
from datetime import datetime, timezone

import pytest
from typer.testing import CliRunner

from tentalis_pipelines import promotion
from tentalis_pipelines.lakehouse import Lakehouse
from tentalis_pipelines.policy import PolicySettings
from tentalis_pipelines.settings import Paths
from tentalis_pipelines.stages.evaluation import resolve_checkpoint
from tentalis_pipelines.stages.rollouts import build_rollouts, current_policy
from tentalis_pipelines.training import checkpoints as ckpt
from tentalis_pipelines.training import serving
from tentalis_pipelines.training.trainer import GRPOConfig, build_policy

NOW = datetime.now(timezone.utc)


@pytest.fixture()
def store(home, tiny_model_dir):
    """A lakehouse with two recorded checkpoints, A (older) and B, neither serving yet."""
    paths = Paths.from_env(home).ensure()
    lake = Lakehouse(paths.lakehouse)
    model = build_policy(tiny_model_dir, None, GRPOConfig())
    for cid in ("ckpt-a", "ckpt-b"):
        path = ckpt.save_adapter(model, paths.checkpoints, cid)
        ckpt.record_checkpoint(lake, {"checkpoint_id": cid, "parent_id": None, "base_model": "tiny", "adapter_uri": str(path),
                                      "algorithm": "grpo", "config": {}, "trained_on": [], "trajectory_ids": [], "trajectory_count": 0,
                                      "metrics": {}, "promoted": False})
    return paths, lake


def test_promoting_an_older_checkpoint_and_rolling_back_take_effect(store):
    paths, lake = store
    assert serving.serving_policy(lake) == ("base", None) and serving.serving_history(lake) == []
    serving.promote(lake, "ckpt-a", actor="alice", reason="first")
    serving.promote(lake, "ckpt-b", actor="gate", reason="better", action="gate")
    serving.promote(lake, "ckpt-a", actor="bob", reason="b misbehaves in production")  # the older one again
    assert serving.serving_policy(lake) == ("ckpt-a", str(paths.checkpoints / "ckpt-a"))
    serving.rollback(lake, actor="bob", reason="a was worse")  # to what served before: b
    assert serving.serving_checkpoint(lake) == "ckpt-b"
    serving.rollback(lake, actor="carol", reason="all the way back", to="base")
    assert serving.serving_policy(lake) == ("base", None)
    history = serving.serving_history(lake)
    assert [(r["seq"], r["from_checkpoint"], r["to_checkpoint"], r["action"], r["actor"]) for r in history] == [
        (1, "base", "ckpt-a", "promote", "alice"), (2, "ckpt-a", "ckpt-b", "gate", "gate"), (3, "ckpt-b", "ckpt-a", "promote", "bob"),
        (4, "ckpt-a", "ckpt-b", "rollback", "bob"), (5, "ckpt-b", "base", "rollback", "carol")]
    assert history[2]["reason"] == "b misbehaves in production"
    # `promoted` keeps meaning "has been promoted at some time".
    assert {r["checkpoint_id"]: r["promoted"] for r in lake.read("checkpoints").to_pylist()} == {"ckpt-a": True, "ckpt-b": True}
    assert resolve_checkpoint(lake, "promoted") == ("base", None)


def test_rollback_and_promote_errors_are_clear(store):
    _, lake = store
    with pytest.raises(serving.ServingError, match="nothing to roll back"):
        serving.rollback(lake, actor="x", reason="y")
    with pytest.raises(serving.ServingError, match="no row"):
        serving.promote(lake, "ckpt-nope", actor="x", reason="y")
    serving.promote(lake, "ckpt-a", actor="x", reason="y")
    with pytest.raises(serving.ServingError, match="already serves"):
        serving.rollback(lake, actor="x", reason="y", to="ckpt-a")
    with pytest.raises(serving.ServingConflict):
        serving.promote(lake, "ckpt-b", actor="trainer", reason="y", expect_from="base")
    assert len(serving.serving_history(lake)) == 1


def test_missing_adapter_files_raise_and_never_fall_back(store):
    paths, lake = store
    serving.promote(lake, "ckpt-a", actor="x", reason="first")
    serving.promote(lake, "ckpt-b", actor="x", reason="second")
    (paths.checkpoints / "ckpt-b" / "adapter_model.safetensors").unlink()
    for read in (lambda: serving.serving_policy(lake), lambda: current_policy(lake, paths),
                 lambda: resolve_checkpoint(lake, "promoted")):
        with pytest.raises(serving.ServingError) as err:
            read()
        assert "ckpt-b" in str(err.value) and "tentalis rollback" in str(err.value) and "tentalis promote" in str(err.value)
    serving.rollback(lake, actor="ops", reason="ckpt-b lost its files")
    assert serving.serving_checkpoint(lake) == "ckpt-a"
    with pytest.raises(serving.ServingError, match="cannot serve checkpoint ckpt-b"):
        serving.promote(lake, "ckpt-b", actor="x", reason="again")


def test_concurrent_promoters_keep_one_chain(store):
    """Every move reads the newest row and appends the next seq under the lock: no two moves share a
    seq, and each row starts where the previous one ended."""
    _, lake = store
    barrier = threading.Barrier(6)
    errors = []

    def worker(i):
        try:
            barrier.wait()
            for _ in range(2):
                serving.promote(lake, ("ckpt-a", "ckpt-b", "base")[i % 3], actor=f"t{i}", reason="race")
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    history = serving.serving_history(lake)
    assert [r["seq"] for r in history] == list(range(1, len(history) + 1))
    assert all(prev["to_checkpoint"] == r["from_checkpoint"] for prev, r in zip(history, history[1:]))
    assert history[0]["from_checkpoint"] == "base"


def test_promote_and_rollback_change_what_the_next_rollout_uses(store, tiny_model_dir, monkeypatch):
    paths, lake = store
    adapters = []
    make = PolicySettings.make_backend
    monkeypatch.setattr(PolicySettings, "make_backend",
                        lambda self, model_dir, adapter_dir=None: (adapters.append(adapter_dir), make(self, model_dir, adapter_dir))[1])
    policy = PolicySettings(model=str(tiny_model_dir), num_generations=2, max_new_tokens=4)

    def rollout_versions(batch_id):
        lake.write_batch("tasks", batch_id, [{"batch_id": batch_id, "task_id": "t0", "source": "test", "environment": "math",
                                              "prompt": "What is 2+3?", "reference": "5", "difficulty": 1, "metadata": "{}",
                                              "created_at": NOW}])
        build_rollouts(lake, paths, batch_id, policy)
        return {r["policy_version"] for r in lake.read("rollouts", batch_id=batch_id).to_pylist()}

    serving.promote(lake, "ckpt-b", actor="x", reason="newest")
    serving.promote(lake, "ckpt-a", actor="x", reason="older, but chosen")
    assert rollout_versions("b1") == {"ckpt-a"}
    serving.rollback(lake, actor="x", reason="back")
    assert rollout_versions("b2") == {"ckpt-b"}
    serving.rollback(lake, actor="x", reason="to base", to="base")
    assert rollout_versions("b3") == {"base"}
    assert adapters == [str(paths.checkpoints / "ckpt-a"), str(paths.checkpoints / "ckpt-b"), None]


def items(cid: str, n_correct: int, skill_ids: tuple[str, ...] = ()) -> list[dict]:
    """60 benchmark items of one checkpoint, the first ``n_correct`` right, each measured with ``skill_ids``."""
    return [{"checkpoint_id": cid, "benchmark": "arithmetic", "item_id": f"i{k}", "prompt": "p", "completion": "c",
             "extracted_answer": "1", "reference": "1", "correct": k < n_correct, "lenient_correct": k < n_correct,
             "formatted": True, "created_at": NOW, "skill_ids": list(skill_ids)} for k in range(60)]


def test_the_gate_promotes_through_the_pointer(store):
    _, lake = store

    serving.promote(lake, "ckpt-b", actor="x", reason="serving")
    for cid, n in (("ckpt-b", 20), ("ckpt-a", 45)):
        lake.replace_where("benchmark_items", {"checkpoint_id": cid, "benchmark": "arithmetic"}, items(cid, n))
    incumbent, decision = promotion.decide_promotion(lake, "ckpt-a", "arithmetic")  # a late result for the older checkpoint
    assert incumbent == "ckpt-b" and decision.promote
    last = serving.serving_history(lake)[-1]
    assert (last["to_checkpoint"], last["action"], last["actor"]) == ("ckpt-a", "gate", "gate")
    assert decision.reason in last["reason"]
    assert promotion.incumbent_for(lake, "ckpt-a") == "base"  # the candidate serves: compared with its parent (none)


def test_a_rejection_is_recorded_and_leaves_the_pointer(store):
    _, lake = store

    for cid, n in (("base", 40), ("ckpt-a", 10), ("ckpt-b", 38)):
        lake.replace_where("benchmark_items", {"checkpoint_id": cid, "benchmark": "arithmetic"}, items(cid, n))
    assert promotion.undecided_checkpoints(lake, "arithmetic") == ["ckpt-a", "ckpt-b"]
    incumbent, decision = promotion.decide_promotion(lake, "ckpt-a", "arithmetic", margin=0.05)
    assert incumbent == "base" and not decision.promote and serving.serving_checkpoint(lake) == "base"
    (row,) = promotion.decisions(lake)
    assert (row["checkpoint_id"], row["incumbent"], row["promote"], row["n_paired"], row["margin"]) == ("ckpt-a", "base", False, 60, 0.05)
    assert abs(row["diff"] - (10 - 40) / 60) < 1e-9 and row["diff_ci_high"] < -0.05 and row["reason"] == decision.reason
    assert promotion.undecided_checkpoints(lake, "arithmetic") == ["ckpt-b"]  # decided once; a later gate never revisits it
    promotion.decide_promotion(lake, "ckpt-a", "arithmetic")  # deciding again replaces the row, never duplicates it
    assert len(promotion.decisions(lake)) == 1
    assert promotion.missing_results(lake, "ckpt-c", "arithmetic") == ["ckpt-c"]
    with pytest.raises(promotion.GateNotReady, match="arithmetic\\|ckpt-c"):
        promotion.decide_promotion(lake, "ckpt-c", "arithmetic")


def test_the_gate_compares_like_with_like_when_the_skill_set_changed(store):
    """The base was measured while a skill was verified (it helped: 30 of 60); the skill was retired and
    the candidate, measured without it, gets 10, which is what the base gets without it too. Compared
    as recorded the candidate would be rejected for the skill's retirement, not for its training."""
    _, lake = store

    def put(cid: str, n: int, sk: tuple[str, ...] = ()) -> None:
        lake.replace_where("benchmark_items", {"checkpoint_id": cid, "benchmark": "arithmetic"}, items(cid, n, sk))

    put("base", 30, ("sk-1",))
    put("ckpt-a", 10)
    assert promotion.skill_mismatches(lake, "ckpt-a", "base", "arithmetic") == sorted(f"i{k}" for k in range(60))
    assert promotion.missing_results(lake, "ckpt-a", "arithmetic") == ["base"]
    with pytest.raises(promotion.GateNotReady, match="'base' was measured on 'arithmetic' with other skills than 'ckpt-a' on 60 of 60 items"):
        promotion.decide_promotion(lake, "ckpt-a", "arithmetic")
    assert promotion.decisions(lake) == [] and serving.serving_checkpoint(lake) == "base"  # nothing decided on the stale pair
    put("base", 10)  # measured again, with the candidate's (empty) skill set
    assert promotion.missing_results(lake, "ckpt-a", "arithmetic") == []
    incumbent, decision = promotion.decide_promotion(lake, "ckpt-a", "arithmetic")
    assert incumbent == "base" and decision.promote and decision.diff == 0.0 and decision.n_paired == 60
    # Only the paired items count, and the order of a row's skill ids does not.
    put("ckpt-b", 10, ("sk-2", "sk-3"))
    put("ckpt-a", 10, ("sk-3", "sk-2"))
    assert promotion.skill_mismatches(lake, "ckpt-b", "ckpt-a", "arithmetic") == []


def test_a_lakehouse_from_before_the_serving_table_keeps_serving_its_promoted_checkpoint(store):
    _, lake = store
    serving.mark_promoted(lake, "ckpt-a")
    assert serving.serving_checkpoint(lake) == "ckpt-a"
    (row,) = serving.serving_history(lake)
    assert row["action"] == "migrate" and row["seq"] == 1


def test_cli_promote_rollback_and_status(store):
    from tentalis_pipelines.cli import app

    runner = CliRunner()
    out = runner.invoke(app, ["rollback", "--reason", "nothing yet"])
    assert out.exit_code == 2 and "nothing to roll back" in out.output
    out = runner.invoke(app, ["promote", "ckpt-a", "--reason", "looks good", "--actor", "alice"])
    assert out.exit_code == 0, out.output
    assert runner.invoke(app, ["promote", "ckpt-b", "--reason", "even better"], env={"USER": "bob"}).exit_code == 0
    out = runner.invoke(app, ["rollback", "--reason", "b regressed"], env={"USER": "carol"})
    assert out.exit_code == 0 and "ckpt-a" in out.output
    out = runner.invoke(app, ["promote", "ckpt-zzz", "--reason", "typo"])
    assert out.exit_code == 2 and "ckpt-zzz" in out.output
    _, lake = store
    assert [(r["to_checkpoint"], r["action"], r["actor"]) for r in serving.serving_history(lake)] == [
        ("ckpt-a", "promote", "alice"), ("ckpt-b", "promote", "bob"), ("ckpt-a", "rollback", "carol")]
    out = runner.invoke(app, ["status"], terminal_width=200)
    assert out.exit_code == 0, out.output
    assert "serving: ckpt-a" in out.output and "serving history" in out.output and "b regressed" in out.output
