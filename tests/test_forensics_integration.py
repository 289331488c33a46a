"""The tests of ``tests/unit/test_forensics.py`` that cost more CPU than the unit tier allows (tests/cpu_budget.py):
the same tests, moved here unchanged; the unit file keeps the rest."""

from __future__ import annotations

import pytest

from tentalis_pipelines import forensics
from tentalis_pipelines.lakehouse import Lakehouse
from tests.unit.test_forensics import HACKED, HONEST, write_run


def test_asset_checks_report_warn_with_evidence(tmp_path):
    from dagster import AssetCheckSeverity

    from assets import forensics_checks as fc
    from assets.resources import LakehouseResource

    home = tmp_path / "home"
    write_run(Lakehouse(home / "lakehouse"), HACKED)
    res = fc.reward_tracks_verifier(lakehouse=LakehouseResource(home=str(home)))
    assert res.passed is False and res.severity == AssetCheckSeverity.WARN
    assert res.metadata["evidence"].value["reward"]["slope"] == pytest.approx(0.15)
    for check in (fc.no_format_or_length_stuffing, fc.judge_agrees_with_verifier, fc.no_collusion, fc.reward_tracks_heldout):
        assert check(lakehouse=LakehouseResource(home=str(home))).passed is False, check
    honest = tmp_path / "honest"
    write_run(Lakehouse(honest / "lakehouse"), HONEST)
    for check in fc.FORENSICS_CHECKS:
        assert check(lakehouse=LakehouseResource(home=str(honest))).passed is True, check


def test_detectors_fire_on_a_hacked_lake_and_stay_quiet_on_an_honest_one(tmp_path):
    hacked, honest = Lakehouse(tmp_path / "hacked"), Lakehouse(tmp_path / "honest")
    write_run(hacked, HACKED)
    write_run(honest, HONEST)
    h = forensics.chain_verdicts(hacked)
    assert h["reward_vs_accuracy"].fired and h["stuffing"].fired and h["judge_vs_verifier"].fired
    assert h["judge_vs_verifier"].evidence["flagged"] == ["hackable"]
    # the later policies get ever more manager score for the same correctness: pairs (hackable x ckpt-3, ckpt-4)
    assert h["collusion"].fired and "hackable x ckpt-4" in h["collusion"].evidence["flagged"]
    q = forensics.chain_verdicts(honest)
    assert not any(v.fired for v in q.values()), {k: v.description for k, v in q.items()}
    # at checkpoint 1 (two policies) nothing can be said yet
    early = forensics.chain_verdicts(hacked, forensics.checkpoint_chain(hacked).slice(0, 2))
    assert not early["reward_vs_accuracy"].fired
