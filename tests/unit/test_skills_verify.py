"""Skills verification with non-default settings and several skills at once (issue #33): the rule's
bounds as given (not the defaults), the paired effect when the two runs list their items in other
orders, which skills a run measures (most supported candidates, oldest verified measurement, not what
this policy measured already) and what the decision rows record. The evaluation is replaced by a
fixed table of right and wrong answers (no model). Each test names the planted bug it was seen failing
against (tools/mutants/catalog/skills.py)."""

from __future__ import annotations

from datetime import timedelta
from types import SimpleNamespace

import pytest

from tentalis_pipelines.evaluation import benchmarks
from tentalis_pipelines.lakehouse import Lakehouse, now_utc
from tentalis_pipelines.settings import Paths
from tentalis_pipelines.skills.library import SkillSettings, decide, skill_effect
from tentalis_pipelines.stages import skills as stage

T0 = now_utc() - timedelta(days=1)


def outcomes(wins: int, losses: int, both: int, n: int = 32) -> tuple[dict[str, bool], dict[str, bool]]:
    """Items i0..i{n-1}: the first ``wins`` right only with the skill, the next ``losses`` right only
    without it, the next ``both`` right in both runs, the rest wrong in both."""
    w = {f"i{k}": k < wins or wins + losses <= k < wins + losses + both for k in range(n)}
    wo = {f"i{k}": wins <= k < wins + losses + both for k in range(n)}
    return w, wo


def test_wins_losses_and_gain_are_paired_by_item_whatever_the_order():
    """Mutants skills-wins-losses-swapped, skills-unpaired-order, skills-bootstrap-args-swapped: 3 wins and
    1 loss of 8, the runs listing their items in other orders."""
    w, wo = outcomes(3, 1, 2, n=8)
    wo = {k: wo[k] for k in ("i3", "i0", "i1", "i2", "i4", "i5", "i6", "i7")}
    e = skill_effect(w, wo)
    assert (e.n, e.wins, e.losses) == (8, 3, 1)
    assert e.gain == pytest.approx(2 / 8) and (e.with_accuracy, e.without_accuracy) == (5 / 8, 3 / 8)
    assert e.ci_low < 0.25 < e.ci_high and e.ci_high > 0 and e.ci_low > -0.5
    hurt = skill_effect(*outcomes(0, 6, 0, n=8))
    assert hurt.gain == pytest.approx(-0.75) and hurt.ci_high < 0 and (hurt.wins, hurt.losses) == (0, 6)


def test_the_rule_applies_the_bounds_it_is_given():
    """Mutant skills-ci-bound-default: min_ci_low above and below zero."""
    strong = skill_effect(*outcomes(6, 0, 4))  # 6 net wins of 32: interval above 0, its low end under 0.1
    assert 0.0 < strong.ci_low < 0.1
    assert decide("candidate", strong)[0] == "verified"
    assert decide("candidate", strong, min_ci_low=0.1)[0] == "candidate"
    mixed = skill_effect(*outcomes(3, 1, 4))  # 2 net wins, the interval reaches below 0
    assert mixed.ci_low < 0
    assert decide("candidate", mixed)[0] == "candidate"
    assert decide("candidate", mixed, min_ci_low=-0.2)[0] == "verified"
    assert decide("candidate", mixed, min_ci_low=-0.2, min_net_wins=3)[0] == "candidate"


def test_a_verified_skill_with_no_gain_left_is_retired():
    """Mutant skills-retire-at-zero: a gain of exactly 0 is no longer a gain."""
    e = skill_effect(*outcomes(2, 2, 4))
    assert e.gain == 0.0 and decide("verified", e)[0] == "retired"
    assert decide("verified", skill_effect(*outcomes(1, 0, 4)))[0] == "verified"


def test_a_validation_seed_on_the_gates_held_out_set_is_refused():
    """Mutant skills-gate-seed-allowed."""
    with pytest.raises(ValueError, match="overlaps"):
        SkillSettings(validation_seed=1_000_000)
    assert SkillSettings(validation_seed=1_000_001).validation_seed == 1_000_001


# --------------------------------------------------------------------------- the stage
RIGHT_WITHOUT = 8  # of 32 validation items the base run answers the first 8


def _skill(sid: str, status: str, support: int, minute: int, measured_on: str | None = None, measured_minute: int | None = None) -> dict:
    at = T0 + timedelta(minutes=minute)
    return {"skill_id": sid, "text": f"lesson {sid}", "failure_type": "wrong_step", "embedding": [0.0], "source_review_ids": ["r"],
            "support": support, "source": "template", "status": status, "gain": None, "ci_low": None, "ci_high": None, "n": None,
            "measured_on": measured_on, "measured_at": None if measured_minute is None else T0 + timedelta(minutes=measured_minute),
            "verified_at": at if status == "verified" else None, "created_at": at, "updated_at": at}


@pytest.fixture
def fake_eval(monkeypatch):
    """Each skill answers RIGHT_WITHOUT + extra[skill] items right (the extra ones are wins)."""
    extra = {"s-big": 4, "s-small": 4, "s-same": 4, "v-old": 0, "v-new": 6, "v-never": 6}
    calls = []

    def evaluate_items(backend, items, *, max_new_tokens, skills=None):
        sid = skills[0][0]["skill_id"] if skills else None
        calls.append(sid)
        right = RIGHT_WITHOUT + (extra[sid] if sid else 0)
        return [SimpleNamespace(item=it, correct=k < right) for k, it in enumerate(items)]

    monkeypatch.setattr(benchmarks, "evaluate_items", evaluate_items)
    return calls


@pytest.fixture
def lake(home) -> Lakehouse:
    lake = Lakehouse(Paths.from_env(home).ensure().lakehouse)
    lake.append("skills", [
        _skill("s-small", "candidate", support=2, minute=0),
        _skill("s-big", "candidate", support=5, minute=1),
        _skill("s-same", "candidate", support=9, minute=2, measured_on="ckpt-7", measured_minute=3),
        _skill("v-new", "verified", support=1, minute=4, measured_on="ckpt-5", measured_minute=50),
        _skill("v-old", "verified", support=1, minute=5, measured_on="ckpt-4", measured_minute=40),
        _skill("v-never", "verified", support=1, minute=6),
    ])
    return lake


def test_a_run_measures_the_most_supported_candidates_and_the_oldest_verified_measurements(lake, fake_eval):
    """Mutants skills-least-supported-first, skills-remeasure-same-policy, skills-recheck-count,
    skills-recheck-newest-first: one candidate (s-big: s-same has more support but was measured on this
    policy), two re-checks (never measured first, then the oldest)."""
    settings = SkillSettings(verify_per_cycle=1, recheck_per_cycle=2)
    changed, decisions, timings = stage.verify_skills(lake, "b1", settings, backend=None, policy_version="ckpt-7")
    assert [(d["kind"], d["skill_id"]) for d in decisions] == [("verify", "s-big"), ("recheck", "v-never"), ("recheck", "v-old")]
    assert fake_eval == [None, "s-big", "v-never", "v-old"] and timings["measured"] == 3


def test_the_stage_decides_with_the_configured_bounds_and_records_the_move(lake, fake_eval):
    """Mutants skills-stage-ci-default, skills-stage-net-wins-default, skills-verified-at-reset,
    skills-decision-from-status: s-big wins 4 of 32 (verified by the defaults) and v-old none (retired)."""
    now = now_utc()
    changed, decisions, _ = stage.verify_skills(lake, "b1", SkillSettings(recheck_per_cycle=2), backend=None, policy_version="ckpt-7",
                                                now=now)
    rows = {r["skill_id"]: r for r in changed}
    assert (rows["s-big"]["status"], rows["s-big"]["verified_at"]) == ("verified", now)
    assert (rows["v-never"]["status"], rows["v-never"]["verified_at"]) == ("verified", T0 + timedelta(minutes=6))  # kept, not re-verified
    assert rows["v-old"]["status"] == "retired"
    assert [(d["skill_id"], d["from_status"], d["to_status"], d["wins"], d["losses"]) for d in decisions] == [
        ("s-big", "candidate", "verified", 4, 0), ("v-never", "verified", "verified", 6, 0), ("v-old", "verified", "retired", 0, 0)]
    assert all(r["measured_on"] == "ckpt-7" and r["measured_at"] == now for r in changed)

    # The same wins under stricter settings: more net wins needed, or a higher interval bound.
    for strict in (SkillSettings(min_net_wins=5), SkillSettings(min_ci_low=0.05)):
        changed, decisions, _ = stage.verify_skills(lake, "b1", strict, backend=None, policy_version="ckpt-8", now=now)
        assert decisions[0]["skill_id"] == "s-same" and decisions[0]["to_status"] == "candidate", decisions[0]["rule"]
