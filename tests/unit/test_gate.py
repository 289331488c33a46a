"""The promotion gate at its edges (issue 33): intervals that straddle zero, a candidate worse within a
non-default margin, ties, items that only one side answered, and chains of several checkpoints where
the incumbent is neither the base model nor the candidate's parent. Checkpoints here are rows with an
empty (but complete) adapter folder: no model is built. Guards the ``gate`` mutant catalogue."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import numpy as np
import pytest

from tentalis_pipelines import promotion
from tentalis_pipelines.evaluation.benchmarks import gate_decision
from tentalis_pipelines.lakehouse import Lakehouse
from tentalis_pipelines.statistics import bootstrap_ci, newcombe_interval, paired_bootstrap
from tentalis_pipelines.training import checkpoints as ckpt
from tentalis_pipelines.training import serving

NOW = datetime(2026, 1, 1, tzinfo=timezone.utc)
N = 60


def runs(losses: int, wins: int, n: int = N) -> tuple[dict[str, bool], dict[str, bool]]:
    """(candidate, incumbent) over ``n`` items: the candidate loses ``losses`` items the incumbent gets
    right, wins ``wins`` it gets wrong, and ties the rest (right on every other item but the last 10,
    which both get wrong: ties of both kinds)."""
    cand, inc = {}, {}
    for k in range(n):
        key = f"i{k:03d}"
        if k < losses:
            cand[key], inc[key] = False, True
        elif k < losses + wins:
            cand[key], inc[key] = True, False
        else:
            cand[key] = inc[key] = k < n - 10
    return cand, inc


# ------------------------------------------------------------------------------------------ statistics
def test_bootstrap_interval_is_the_two_sided_percentile_of_the_seeded_resamples():
    v = np.array([1.0] * 21 + [0.0] * 39)
    means = v[np.random.default_rng(0).integers(0, v.size, size=(2000, v.size))].mean(axis=1)
    assert bootstrap_ci(v) == (float(np.quantile(means, 0.025)), float(np.quantile(means, 0.975)))
    assert bootstrap_ci(v, alpha=0.1) == (float(np.quantile(means, 0.05)), float(np.quantile(means, 0.95)))


def test_newcombe_by_the_papers_example():
    # Newcombe (1998), table II, example (a): 56/70 vs 48/80, method 10: 0.0524 to 0.3339 (after minus before).
    lo, hi = newcombe_interval(48, 80, 56, 70)
    assert (lo, hi) == (pytest.approx(0.0524, abs=1e-4), pytest.approx(0.3339, abs=1e-4))
    lo, hi = newcombe_interval(56, 70, 48, 80)  # the other way round: the mirror image
    assert (lo, hi) == (pytest.approx(-0.3339, abs=1e-4), pytest.approx(-0.0524, abs=1e-4))


def test_ties_count_in_the_paired_mean():
    cand, inc = runs(losses=0, wins=1)  # one win, 59 ties
    d, lo, hi = paired_bootstrap([float(v) for v in cand.values()], [float(v) for v in inc.values()])
    assert d == pytest.approx(1 / N) and lo == 0.0 and 0 < hi < 0.1
    assert paired_bootstrap([1.0, 0.0], [1.0, 0.0]) == (0.0, 0.0, 0.0)  # nothing but ties


# ------------------------------------------------------------------------------------------ gate_decision
def test_an_interval_straddling_zero_promotes_even_with_a_worse_point_estimate():
    cand, inc = runs(losses=3, wins=2)
    d = gate_decision(cand, inc)
    assert d.diff == pytest.approx(-1 / N) and d.diff_ci_low < d.diff < 0 < d.diff_ci_high
    assert d.promote and d.reason.startswith("promoted")


def test_worse_beyond_the_interval_is_rejected_unless_within_the_margin():
    cand, inc = runs(losses=6, wins=0)
    strict = gate_decision(cand, inc)
    assert strict.diff_ci_low < strict.diff_ci_high < 0 and not strict.promote and strict.reason.startswith("rejected")
    assert strict.diff_ci_high > -0.05  # worse, but by less than a 5-point margin can be sure of
    assert gate_decision(cand, inc, margin=0.05).promote
    assert not gate_decision(cand, inc, margin=0.01).promote
    same = gate_decision(inc, inc, margin=0.05)  # equal runs pass any margin, also a positive one
    assert same.promote and (same.diff, same.diff_ci_low, same.diff_ci_high) == (0.0, 0.0, 0.0)


def test_the_gate_pairs_items_by_id_whatever_their_order_and_ignores_the_unpaired():
    cand, inc = runs(losses=2, wins=2)
    shuffled = dict(reversed(list(inc.items())))
    shuffled["only-incumbent"] = True
    cand = {"only-candidate": False, **cand}
    d = gate_decision(cand, shuffled)
    assert d.n_paired == N and d.diff == 0.0
    assert (d.candidate_accuracy, d.incumbent_accuracy) == (pytest.approx(48 / N), pytest.approx(48 / N))
    assert d.diff_ci_low > -0.1 and d.diff_ci_high < 0.1  # paired: only the 4 discordant items vary
    same = gate_decision(inc, shuffled)
    assert (same.diff, same.diff_ci_low, same.diff_ci_high) == (0.0, 0.0, 0.0)


def test_ties_are_not_wins():
    cand, inc = runs(losses=0, wins=0)  # 50 right and 10 wrong on both sides
    d = gate_decision(cand, inc)
    assert (d.candidate_accuracy, d.diff) == (pytest.approx(50 / N), 0.0)


# ------------------------------------------------------------------------------------------ chains
@pytest.fixture()
def lake(tmp_path):
    return Lakehouse(tmp_path / "lake")


def add_checkpoint(lake: Lakehouse, tmp_path, cid: str, parent: str | None) -> None:
    folder = tmp_path / "ckpts" / cid
    folder.mkdir(parents=True)
    (folder / ckpt.MARKER).write_text(json.dumps({"files": []}))
    ckpt.record_checkpoint(lake, {"checkpoint_id": cid, "parent_id": parent, "base_model": "tiny", "adapter_uri": str(folder),
                                  "algorithm": "grpo", "config": {}, "trained_on": [], "trajectory_ids": [], "trajectory_count": 0,
                                  "metrics": {}, "promoted": False})


def put_results(lake: Lakehouse, cid: str, correct: dict[str, bool]) -> None:
    lake.replace_where("benchmark_items", {"checkpoint_id": cid, "benchmark": "arithmetic"}, [
        {"checkpoint_id": cid, "benchmark": "arithmetic", "item_id": k, "prompt": "p", "completion": "c", "extracted_answer": "1",
         "reference": "1", "correct": v, "lenient_correct": v, "formatted": True, "created_at": NOW, "skill_ids": []}
        for k, v in correct.items()])


def first_n(n_correct: int) -> dict[str, bool]:
    return {f"i{k:03d}": k < n_correct for k in range(N)}


def test_a_chain_of_three_checkpoints_is_gated_against_what_serves(lake, tmp_path):
    for cid, parent in (("c1", None), ("c2", "c1"), ("c3", "c2")):
        add_checkpoint(lake, tmp_path, cid, parent)
    put_results(lake, "base", first_n(20))
    put_results(lake, "c1", first_n(45))
    put_results(lake, "c2", first_n(30))  # better than the base, worse than c1

    assert promotion.incumbent_for(lake, "c1") == "base"
    incumbent, d = promotion.decide_promotion(lake, "c1", "arithmetic")
    assert incumbent == "base" and d.promote and serving.serving_checkpoint(lake) == "c1"

    assert promotion.incumbent_for(lake, "c2") == "c1"  # what serves, not the base
    incumbent, d = promotion.decide_promotion(lake, "c2", "arithmetic")
    assert incumbent == "c1" and not d.promote and d.incumbent_accuracy == pytest.approx(45 / N)
    assert serving.serving_checkpoint(lake) == "c1"

    # c3 descends from the rejected c2: it is compared with c1, which serves, not with its parent
    assert promotion.incumbent_for(lake, "c3") == "c1"
    put_results(lake, "c3", first_n(46))
    incumbent, d = promotion.decide_promotion(lake, "c3", "arithmetic")
    assert incumbent == "c1" and d.promote and serving.serving_checkpoint(lake) == "c3"
    # once c3 serves, a re-decision compares it with its parent, not the base
    assert promotion.incumbent_for(lake, "c3") == "c2"
    assert [(r["checkpoint_id"], r["incumbent"], r["promote"]) for r in promotion.decisions(lake)] == [
        ("c1", "base", True), ("c2", "c1", False), ("c3", "c1", True)]


def test_the_gates_margin_reaches_the_decision_and_its_record(lake, tmp_path):
    add_checkpoint(lake, tmp_path, "c1", None)
    cand, inc = runs(losses=6, wins=0)
    put_results(lake, "base", inc)
    put_results(lake, "c1", cand)
    _, strict = promotion.decide_promotion(lake, "c1", "arithmetic", apply=False)
    assert not strict.promote
    incumbent, d = promotion.decide_promotion(lake, "c1", "arithmetic", margin=0.05)
    assert incumbent == "base" and d.promote and serving.serving_checkpoint(lake) == "c1"
    (row,) = promotion.decisions(lake)
    assert (row["promote"], row["margin"]) == (True, 0.05)
