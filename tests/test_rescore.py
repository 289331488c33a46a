"""Reward versions: re-scoring stored rollouts without sampling them again, the diff against the active
version, and activation (trajectories and training change only then). Real Delta tables, real stages,
a real Dagster instance."""

from __future__ import annotations

import json
import math

import pytest
from dagster import DagsterInstance, materialize
from typer.testing import CliRunner

from tentalis_pipelines.lakehouse import Lakehouse
from tentalis_pipelines.rewards.judge import JudgeConfig, JudgePRM
from tentalis_pipelines.rewards.llm_manager import LLMManager
from tentalis_pipelines.rewards.rescore import RescoreSpec
from tentalis_pipelines.rewards.scoring import parse_weight_overrides
from tentalis_pipelines.settings import Paths
from tentalis_pipelines.stages.human_reviews import import_human_reviews
from tentalis_pipelines.stages.rescore import (
    activate_reward_version,
    active_reward_version,
    read_version,
    rescore,
)
from tentalis_pipelines.stages.reviews import build_reviews
from tentalis_pipelines.stages.training import untrained_trajectories
from tentalis_pipelines.stages.trajectories import build_trajectories
from tests.rescore_rows import COMPONENTS, ScriptedBackend, seed_batch

NEW_WEIGHTS = {"outcome": 0.0, "format": 1.0, "manager": 0.1}  # process keeps 0.2


def hand_reward(outcome, fmt, process, manager, w=(1.0, 0.2, 0.2, 0.5)) -> float:
    return w[0] * outcome + w[1] * fmt + (w[2] * process if process is not None else 0.0) + w[3] * manager


def hand_advantages(rewards: list[float]) -> list[float]:
    """(r - mean) / (sample std + 1e-4), the group normalisation the README states."""
    m = sum(rewards) / len(rewards)
    s = math.sqrt(sum((r - m) ** 2 for r in rewards) / (len(rewards) - 1))
    return [(r - m) / (s + 1e-4) for r in rewards]


@pytest.fixture()
def lake(home) -> Lakehouse:
    lake = Lakehouse(Paths.from_env(home).ensure().lakehouse)
    seed_batch(lake)
    return lake


def _traj(lake: Lakehouse) -> dict[str, dict]:
    return {r["rollout_id"]: r for r in lake.read("trajectories").to_pylist()}


def test_the_seed_matches_the_hand_computed_components(lake):
    t = _traj(lake)
    for r, (o, f, p, m) in COMPONENTS.items():
        assert (t[r]["outcome_reward"], t[r]["format_reward"], t[r]["process_reward"], t[r]["manager_score"]) == (o, f, p, m)
        assert t[r]["reward"] == pytest.approx(hand_reward(o, f, p, m), abs=1e-12)
        assert t[r]["reward_version"] == "v0"


def test_weights_only_rescore_is_exact_and_leaves_trajectories_alone(lake):
    before, version = _traj(lake), lake.table("trajectories").version()
    res = rescore(lake, RescoreSpec("v1", weights=parse_weight_overrides(json.dumps(NEW_WEIGHTS))))
    rows = {r["rollout_id"]: r for r in read_version(lake, "v1")}
    ids = ["r0", "r1", "r2"]
    want = {r: hand_reward(*COMPONENTS[r], w=(0.0, 1.0, 0.2, 0.1)) for r in ids}
    assert [round(want[r], 10) for r in ids] == [1.3, 1.01, 0.07]  # 0+1+.2+.1, 0+1+0+.01, 0+0+0+.07
    base_adv = dict(zip(ids, hand_advantages([1.9, 0.25, 1.35])))
    adv = dict(zip(ids, hand_advantages([want[r] for r in ids])))
    for r in ids:
        assert rows[r]["reward"] == pytest.approx(want[r], abs=1e-12)
        assert rows[r]["advantage"] == pytest.approx(adv[r], abs=1e-12)
        assert rows[r]["base_reward"] == pytest.approx(hand_reward(*COMPONENTS[r]), abs=1e-12)
        assert rows[r]["base_advantage"] == pytest.approx(base_adv[r], abs=1e-12)
        assert rows[r]["reward_delta"] == pytest.approx(want[r] - hand_reward(*COMPONENTS[r]), abs=1e-12)
        assert json.loads(rows[r]["reward_weights"]) == {"outcome": 0.0, "format": 1.0, "process": 0.2, "manager": 0.1}
    # r1 (0.25 -> 1.01) overtakes r2 (1.35 -> 0.07): ranks 3 -> 2 and 2 -> 3, and both advantages change sign.
    assert {r: (rows[r]["base_rank"], rows[r]["rank"]) for r in ids} == {"r0": (1, 1), "r1": (3, 2), "r2": (2, 3)}
    assert base_adv["r1"] < 0 < adv["r1"] and adv["r2"] < 0 < base_adv["r2"]
    assert {r: rows[r]["sign_flip"] for r in ids} == {"r0": False, "r1": True, "r2": True}
    assert (res.metadata["changed"], res.metadata["rank_changes"], res.metadata["sign_flips"]) == (3, 2, 2)
    assert res.metadata["max_abs_delta"] == pytest.approx(1.28, abs=1e-5) and res.metadata["base_version"] == "v0"
    # Nothing trains on it yet: trajectories are the same commit, the same rows; the pipeline's rewards are kept as v0.
    assert lake.table("trajectories").version() == version and _traj(lake) == before
    assert active_reward_version(lake) == "v0"
    v0 = {r["rollout_id"]: r for r in read_version(lake, "v0")}
    assert {r: (v0[r]["reward"], v0[r]["advantage"]) for r in ids} == {r: (before[r]["reward"], before[r]["advantage"]) for r in ids}


def test_unchanged_weights_reproduce_the_pipeline_exactly(lake):
    """The re-score arithmetic is the trajectories stage's: the default weights give back every reward
    and advantage bit for bit."""
    rescore(lake, RescoreSpec("same", weights=parse_weight_overrides('{"math": {"manager": 0.5}}')))
    t = _traj(lake)
    for r in read_version(lake, "same"):
        assert (r["reward"], r["advantage"], r["kept"], r["step_advantages"]) == \
            (t[r["rollout_id"]]["reward"], t[r["rollout_id"]]["advantage"], t[r["rollout_id"]]["kept"], t[r["rollout_id"]]["step_advantages"])
        assert r["reward_delta"] == 0.0 and r["rank_change"] == 0 and r["sign_flip"] is False


def test_a_rescore_scales_step_rewards_as_the_trajectories_stage_does(lake):
    """With ``scale_rewards='none'`` the re-score's step advantages are the trajectories stage's (only centred), not
    the group-scaled ones: the same arithmetic in both places."""
    build_trajectories(lake, "b1", advantage_mode="process", scale_rewards="none")
    rescore(lake, RescoreSpec("centred", weights=parse_weight_overrides('{"math": {"manager": 0.5}}')), scale_rewards="none")
    t = _traj(lake)
    rows = read_version(lake, "centred")
    assert any(any(a != 0.0 for a in t[r["rollout_id"]]["step_advantages"]) for r in rows)
    for r in rows:
        assert r["step_advantages"] == pytest.approx(t[r["rollout_id"]]["step_advantages"])
    rescore(lake, RescoreSpec("scaled", weights=parse_weight_overrides('{"math": {"manager": 0.5}}')))
    assert [r["step_advantages"] for r in read_version(lake, "scaled")] != [r["step_advantages"] for r in rows]


def test_a_version_without_signal_zeroes_the_advantages_and_drops_the_group(lake):
    """Every weight 0: rewards all 0, so every advantage goes to exactly 0 (a sign change from - or +)
    and dynamic sampling drops the group (kept 3 -> 0)."""
    zero = {k: 0.0 for k in ("outcome", "format", "process", "manager")}
    res = rescore(lake, RescoreSpec("flat", weights=parse_weight_overrides(json.dumps(zero))), dynamic_sampling=True)
    rows = read_version(lake, "flat")
    assert [(r["reward"], r["advantage"], r["kept"], r["sign_flip"], r["rank"]) for r in rows] == [(0.0, 0.0, False, True, 1)] * 3
    assert (res.metadata["sign_flips"], res.metadata["kept_before"], res.metadata["kept_after"]) == (3, 3, 0)


def test_activation_switches_training_and_is_recorded(lake):
    rescore(lake, RescoreSpec("v1", weights=parse_weight_overrides(json.dumps(NEW_WEIGHTS))))
    fresh = {r["rollout_id"]: r["advantage"] for r in untrained_trajectories(lake, "base").to_pylist()}
    assert fresh == pytest.approx(dict(zip(["r0", "r1", "r2"], hand_advantages([1.9, 0.25, 1.35]))))
    row = activate_reward_version(lake, "v1", actor="ana", reason="format matters more than the manager")
    assert (row["seq"], row["from_version"], row["to_version"], row["actor"], row["rows"], row["batches"]) == (1, "v0", "v1", "ana", 3, ["b1"])
    assert lake.read("reward_activations").to_pylist()[0]["reason"] == "format matters more than the manager"
    v1 = {r["rollout_id"]: r for r in read_version(lake, "v1")}
    fresh = {r["rollout_id"]: r for r in untrained_trajectories(lake, "base").to_pylist()}  # what train_checkpoint reads
    assert {r: (fresh[r]["reward"], fresh[r]["advantage"], fresh[r]["reward_version"]) for r in v1} == \
        {r: (v1[r]["reward"], v1[r]["advantage"], "v1") for r in v1}
    assert active_reward_version(lake) == "v1"
    # A batch built after the activation takes the active version's weights.
    seed_batch(lake, "b2")
    b2 = {r["rollout_id"]: r for r in lake.read("trajectories", batch_id="b2").to_pylist()}
    assert b2["b2-r0"]["reward"] == pytest.approx(1.3, abs=1e-12) and b2["b2-r0"]["reward_version"] == "v1"
    # Back to the pipeline's own rewards: exactly what they were.
    activate_reward_version(lake, "v0", actor="ana", reason="undo")
    t = _traj(lake)
    assert {r: t[r]["reward"] for r in ("r0", "r1", "r2")} == pytest.approx({"r0": 1.9, "r1": 0.25, "r2": 1.35}, abs=1e-12)
    assert [r["seq"] for r in lake.read("reward_activations").to_pylist()] in ([1, 2], [2, 1])


def test_bad_requests_are_refused_with_the_fix(lake):
    with pytest.raises(ValueError, match="unknown reward version 'nope'"):
        activate_reward_version(lake, "nope", actor="a", reason="r")
    with pytest.raises(ValueError, match="unknown reward component 'manger'"):
        parse_weight_overrides('{"manger": 1}')
    with pytest.raises(ValueError, match="not valid JSON"):
        parse_weight_overrides("{manager: 1}")
    with pytest.raises(ValueError, match="no single-turn trajectories for batch"):
        rescore(lake, RescoreSpec("v1", weights={"*": {"manager": 1.0}}), batches=["b9"])
    with pytest.raises(ValueError, match="needs a manager model"):
        rescore(lake, RescoreSpec("v1", manager="llm"))
    rescore(lake, RescoreSpec("v1", weights={"*": {"manager": 1.0}}))
    activate_reward_version(lake, "v1", actor="a", reason="r")
    with pytest.raises(ValueError, match="is active"):
        rescore(lake, RescoreSpec("v1", weights={"*": {"manager": 0.0}}))
    with pytest.raises(ValueError, match="already active"):
        activate_reward_version(lake, "v1", actor="a", reason="r")


def test_a_version_made_before_the_trajectories_changed_is_not_activated(lake, tmp_path):
    rescore(lake, RescoreSpec("v1", weights=parse_weight_overrides(json.dumps(NEW_WEIGHTS))))
    f = tmp_path / "human.jsonl"
    f.write_text(json.dumps({"rollout_id": "r1", "score": 0.9, "critique": "a fair slip"}) + "\n")
    import_human_reviews(lake, f)
    build_reviews(lake, "b1", manager="human")
    build_trajectories(lake, "b1")  # r1's manager score is now the human's 0.9
    with pytest.raises(ValueError, match=r"1 rollout\(s\) changed since 'v1' was re-scored"):
        activate_reward_version(lake, "v1", actor="a", reason="r")
    assert _traj(lake)["r1"]["manager_score"] == 0.9 and active_reward_version(lake) == "v0"


def test_rescore_with_the_llm_manager_and_the_judge_uses_their_code_paths(home, tmp_path):
    lake = Lakehouse(Paths.from_env(home).ensure().lakehouse)
    seed_batch(lake)
    # A human reviewed r0: the batch's reviews are rebuilt with manager=human, so r0's review is the human's.
    f = tmp_path / "human.jsonl"
    f.write_text(json.dumps({"rollout_id": "r0", "score": 0.3, "critique": "right, but terse"}) + "\n")
    import_human_reviews(lake, f)
    build_reviews(lake, "b1", manager="human")
    build_trajectories(lake, "b1")
    backend = ScriptedBackend('8, "critique": "fine", "hint": "none"}')
    manager = LLMManager(backend, rubric="Grade strictly by the PIRATE rubric.")
    rescore(lake, RescoreSpec("llm8", manager="llm", rubric="Grade strictly by the PIRATE rubric.", rubric_name="pirate"),
            llm_manager=manager)
    assert len(backend.prompts) == 3 and all("PIRATE rubric" in p for p in backend.prompts)
    rows = {r["rollout_id"]: r for r in read_version(lake, "llm8")}
    # 8/10 from the manager; r1's answer is wrong, so ground truth caps it at 0.5; r0 keeps its human's 0.3.
    assert {r: (rows[r]["judge_score"], rows[r]["manager_score"], rows[r]["manager"]) for r in rows} == \
        {"r0": (0.8, 0.3, "human"), "r1": (0.5, 0.5, "llm"), "r2": (0.8, 0.8, "llm")}
    assert {r: rows[r]["reward"] for r in rows} == pytest.approx(
        {"r0": hand_reward(1, 1, 1, 0.3), "r1": hand_reward(0, 1, 0, 0.5), "r2": hand_reward(1, 0, None, 0.8)}, abs=1e-12)

    judge = JudgePRM(ScriptedBackend("-1}"), JudgeConfig(num_votes=3, forced_verdict=True))
    rescore(lake, RescoreSpec("harsh", step_scorer="judge"), judge=judge)
    rows = {r["rollout_id"]: r for r in read_version(lake, "harsh")}
    # Every step judged wrong (-1 -> 0.0): the process credit of r0 and r1 is 0. r2 is untagged, so, as in the pipeline's
    # step_scores stage, the judge is not asked about it (judge_formatted) and it earns no process credit.
    assert {r: (rows[r]["step_rewards"], rows[r]["process_reward"]) for r in rows} == \
        {"r0": ([0.0], 0.0), "r1": ([0.0], 0.0), "r2": ([None], None)}
    assert rows["r0"]["reward"] == pytest.approx(hand_reward(1, 1, 0, 0.3), abs=1e-12)
    assert lake.read("step_scores").column("scorer").to_pylist() == ["calculator"] * 3  # stored step scores untouched


def test_rescore_job_materialises_with_an_inline_plot_and_the_cli_activates(home, monkeypatch):
    monkeypatch.delenv("DAGSTER_HOME", raising=False)
    from assets.resources import (
        LakehouseResource,
        PolicyResource,
        ReviewResource,
        TrainerResource,
    )
    from assets.trust_assets import reward_versions
    from tentalis_pipelines.cli import app

    lake = Lakehouse(Paths.from_env(home).ensure().lakehouse)
    seed_batch(lake)
    resources = {"lakehouse": LakehouseResource(home=str(home)), "policy": PolicyResource(), "review": ReviewResource(),
                 "trainer": TrainerResource(loss_type="grpo")}
    with DagsterInstance.ephemeral() as inst:
        result = materialize([reward_versions], instance=inst, resources=resources,
                             run_config={"ops": {"reward_versions": {"config": {"version": "v1", "weights": json.dumps(NEW_WEIGHTS)}}}})
    assert result.success
    meta = result.asset_materializations_for_node("reward_versions")[0].metadata
    assert meta["sign_flips"].value == 2 and meta["rank_changes"].value == 2 and meta["dagster/row_count"].value == 3
    plot = meta["plot"].value
    assert plot.startswith("![plot](data:image/svg+xml,") and len(plot) < 1000 and "reward%20v1" in plot

    runner = CliRunner()
    out = runner.invoke(app, ["rescore", "--version", "v2", "--weights", '{"manager": 2.0}', "--format", "json"])
    assert out.exit_code == 0, out.output
    summary = json.loads(out.output.strip().splitlines()[-1])
    # manager weight 0.5 -> 2.0: each reward moves by 1.5 x the manager score (1.0, 0.1, 0.7)
    assert summary["base_version"] == "v0" and summary["max_abs_delta"] == pytest.approx(1.5, abs=1e-12)
    assert summary["mean_delta"] == pytest.approx(1.5 * (1.0 + 0.1 + 0.7) / 3, abs=1e-12)
    out = runner.invoke(app, ["rescore", "--activate", "v2", "--reason", "managers know best", "--actor", "ana"])
    assert out.exit_code == 0 and "v2" in out.output and "3 trajectories" in out.output, out.output
    assert _traj(lake)["r1"]["reward"] == pytest.approx(hand_reward(0, 1, 0, 0.1, w=(1.0, 0.2, 0.2, 2.0)), abs=1e-12)
    listed = json.loads(runner.invoke(app, ["rescore", "--list", "--format", "json"]).output)
    assert listed["active"] == "v2" and [a["actor"] for a in listed["activations"]] == ["ana"]
    assert {v["reward_version"] for v in listed["versions"]} == {"v0", "v1", "v2"}
    bad = runner.invoke(app, ["rescore", "--version", "v3", "--weights", '{"speed": 1}'])
    assert bad.exit_code == 2 and "unknown reward component 'speed'" in " ".join(bad.output.split())
    (home / "rubric.txt").write_bytes(b"Grade \xff strictly")
    bad = runner.invoke(app, ["rescore", "--version", "v3", "--manager", "llm", "--rubric", str(home / "rubric.txt")])
    assert bad.exit_code == 2 and "not valid UTF-8" in " ".join(bad.output.split())
    none = runner.invoke(app, ["rescore", "--version", "v3"])
    assert none.exit_code == 2 and "nothing to change" in " ".join(none.output.split())
