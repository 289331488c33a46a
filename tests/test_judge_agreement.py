"""Judge-versus-manager agreement: numbers against a hand computation, per batch and overall, on real
Delta tables; the drift check fires on a judge whose agreement falls and stays quiet on one that holds."""

from __future__ import annotations

import json
import math
from datetime import datetime, timedelta, timezone

import pytest
from dagster import AssetCheckSeverity, DagsterInstance, materialize

from tentalis_pipelines.lakehouse import Lakehouse
from tentalis_pipelines.rewards.agreement import (
    DriftSettings,
    agreement_stats,
    average_ranks,
    drift_outcomes,
    spearman,
)
from tentalis_pipelines.rewards.llm_manager import LLMManager
from tentalis_pipelines.rewards.rescore import RescoreSpec
from tentalis_pipelines.settings import Paths
from tentalis_pipelines.stages.human_reviews import import_human_reviews
from tentalis_pipelines.stages.judge_agreement import build_judge_agreement
from tentalis_pipelines.stages.rescore import rescore
from tests.rescore_rows import ScriptedBackend, seed_batch

# The verifier's reviews of r0, r1, r2 are 1.0, 0.1, 0.7 in every batch (tests/rescore_rows.py).
AGREEING = {"r0": 0.9, "r1": 0.2, "r2": 0.8}  # same pass/fail as the verifier on all three


def test_statistics_by_hand():
    assert average_ranks([0.7, 0.1, 0.7, 0.4]) == [3.5, 1.0, 3.5, 2.0]
    s = agreement_stats([1.0, 0.1, 0.7], [0.9, 0.6, 0.2])
    # |d| = 0.1, 0.5, 0.5; ranks (3, 1, 2) vs (3, 2, 1): 1 - 6 * (0 + 1 + 1) / (3 * (9 - 1)) = 0.5; pass/fail agree on r0 only
    assert s["mean_abs_diff"] == pytest.approx(1.1 / 3) and s["spearman"] == pytest.approx(0.5) and s["pass_agreement"] == pytest.approx(1 / 3)
    assert spearman([0.5, 0.5, 0.5], [0.1, 0.2, 0.3]) is None  # undefined, not 0
    assert agreement_stats([0.5], [0.49])["pass_agreement"] == 0.0  # 0.5 passes, 0.49 fails


def _import(lake: Lakehouse, tmp_path, scores: dict[str, float], name: str) -> None:
    f = tmp_path / f"{name}.jsonl"
    f.write_text("".join(json.dumps({"rollout_id": r, "score": s, "reviewer": "ana"}) + "\n" for r, s in scores.items()))
    assert import_human_reviews(lake, f)["applied"] == len(scores)


def _live(lake: Lakehouse, rollout_id: str, reviews: list[tuple[str, float, datetime]]) -> None:
    lake.write_batch("reviews", "live", [
        {"batch_id": "live", "rollout_id": rollout_id, "manager": who, "score": s, "critique": "", "hint": "", "created_at": at,
         "review_id": f"rv{i}", "session_id": None, "reviewer": who, "rubric": None, "tenant": "t"}
        for i, (who, s, at) in enumerate(reviews)])


@pytest.fixture()
def lake(home, tmp_path) -> Lakehouse:
    """b1: the humans agree with the verifier; b2 (later): they disagree on two of three rollouts."""
    lake = Lakehouse(Paths.from_env(home).ensure().lakehouse)
    seed_batch(lake, "b1")
    seed_batch(lake, "b2")
    _import(lake, tmp_path, AGREEING, "b1")
    _import(lake, tmp_path, {"b2-r0": 0.9, "b2-r1": 0.6}, "b2")
    now = datetime.now(timezone.utc)
    # Two live reviewers of b2-r2: a's latest (0.1, not the earlier 0.5) and b's 0.3, averaged: 0.2.
    _live(lake, "b2-r2", [("a", 0.5, now - timedelta(minutes=5)), ("a", 0.1, now), ("b", 0.3, now)])
    return lake


def test_agreement_per_batch_and_overall_by_hand(lake):
    res, outcomes, rows = build_judge_agreement(lake, window="batch")
    table = {(r["judge"], r["window_id"]): r for r in lake.read("judge_agreement").to_pylist()}
    assert set(table) == {("verifier", "b1"), ("verifier", "b2"), ("verifier", "all")}
    b1, b2, overall = table[("verifier", "b1")], table[("verifier", "b2")], table[("verifier", "all")]
    assert (b1["n"], b1["mean_abs_diff"], b1["spearman"], b1["pass_agreement"]) == (3, pytest.approx(0.1), pytest.approx(1.0), 1.0)
    # b2: (1.0, 0.9), (0.1, 0.6), (0.7, 0.2 = mean of the live reviewers' latest)
    assert (b2["n"], b2["mean_abs_diff"], b2["spearman"], b2["pass_agreement"]) == (3, pytest.approx(1.1 / 3), pytest.approx(0.5), pytest.approx(1 / 3))
    assert b2["human_mean"] == pytest.approx((0.9 + 0.6 + 0.2) / 3) and b2["judge_mean"] == pytest.approx(0.6)
    # Overall, six pairs. Average ranks: judge (5.5, 1.5, 3.5, 5.5, 1.5, 3.5), human (5.5, 1.5, 4, 5.5, 3, 1.5);
    # centred products sum to 13, squares to 16 and 16.5.
    assert overall["n"] == 6 and overall["mean_abs_diff"] == pytest.approx(1.4 / 6) and overall["pass_agreement"] == pytest.approx(4 / 6)
    assert overall["spearman"] == pytest.approx(13 / math.sqrt(16 * 16.5))
    assert b1["window_start"] < b2["window_start"] and res.metadata["pairs"] == 6
    # The verifier held in b1 and fell in b2: below the floor, and a drop of 0.67 > 0.2.
    (o,) = drift_outcomes(rows, DriftSettings(min_n=3))
    assert o.drifting and len(o.reasons) == 2 and "0.33" in o.reasons[0] and "b1 -> b2" in o.reasons[1]
    day = build_judge_agreement(lake, window="day")[2]
    assert [r["window_id"] for r in day if r["window_kind"] == "day"] == [datetime.now(timezone.utc).date().isoformat()]


def test_a_judge_that_tracks_its_managers_is_not_flagged_and_a_rescore_judge_is_measured(home, tmp_path):
    lake = Lakehouse(Paths.from_env(home).ensure().lakehouse)
    seed_batch(lake, "b1")
    seed_batch(lake, "b2")
    _import(lake, tmp_path, AGREEING, "b1")
    _import(lake, tmp_path, {f"b2-{r}": s for r, s in AGREEING.items()}, "b2")
    rescore(lake, RescoreSpec("llm8", manager="llm", rubric="Be strict.", rubric_name="strict"), batches=["b1"],
            llm_manager=LLMManager(ScriptedBackend('8, "critique": "ok", "hint": ""}'), rubric="Be strict."))
    _, outcomes, rows = build_judge_agreement(lake)
    assert [(o.judge, o.drifting) for o in drift_outcomes(rows, DriftSettings(min_n=3))] == [("llm8:llm", True), ("verifier", False)]
    llm = next(r for r in rows if r["judge"] == "llm8:llm" and r["window_kind"] == "all")
    # The scripted manager says 8/10; ground truth caps the wrong r1 at 0.5: (0.8, 0.5, 0.8) against (0.9, 0.2, 0.8).
    assert (llm["rubric"], llm["n"], llm["mean_abs_diff"], llm["pass_agreement"]) == ("strict", 3, pytest.approx(0.4 / 3), pytest.approx(2 / 3))
    assert llm["spearman"] == pytest.approx(1.5 / math.sqrt(1.5 * 2))


def test_the_asset_flags_the_drifting_judge_with_an_inline_plot(lake):
    from assets.resources import LakehouseResource
    from assets.trust_assets import judge_agreement

    with DagsterInstance.ephemeral() as inst:
        result = materialize([judge_agreement], instance=inst, resources={"lakehouse": LakehouseResource(home=str(Paths.from_env().home))},
                             run_config={"ops": {"judge_agreement": {"config": {"min_n": 3}}}}, raise_on_error=False)
    assert result.success
    (check,) = result.get_asset_check_evaluations()
    assert check.check_name == "judge_tracks_managers" and not check.passed and check.severity == AssetCheckSeverity.WARN
    assert "verifier/default" in check.description and "0.33 < 0.70" in check.description
    meta = result.asset_materializations_for_node("judge_agreement")[0].metadata
    assert meta["dagster/row_count"].value == 3 and meta["drifting"].value == "verifier/default"
    assert meta["plot"].value.startswith("![plot](data:image/svg+xml,") and len(meta["plot"].value) < 1000


def test_the_cli_prints_agreement_and_the_drift_verdict(lake, monkeypatch):
    from typer.testing import CliRunner

    from tentalis_pipelines.cli import app

    monkeypatch.delenv("DAGSTER_HOME", raising=False)
    out = CliRunner().invoke(app, ["agreement", "--format", "json"])
    assert out.exit_code == 0, out.output
    got = json.loads(out.output.strip().splitlines()[-1])
    by = {(r["judge"], r["window_id"]): r for r in got["rows"]}
    assert by[("verifier", "b2")]["pass_agreement"] == pytest.approx(1 / 3) and by[("verifier", "all")]["n"] == 6
    assert got["drift_check_passed"] is True  # default min_n = 5: no window has enough pairs to judge yet
    text = CliRunner().invoke(app, ["agreement"])
    assert text.exit_code == 0 and "verifier" in text.output and "no judge drifts" in text.output
