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
from tentalis_pipelines.settings import Paths
from tests.rescore_rows import seed_batch

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
