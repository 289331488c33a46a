"""Retraction over a chain of three checkpoints, written by hand (no model; tests/chain_rows.py): a
retraction of what c1 learnt from taints c2, c3 and c4 (inherited) but not the sibling x1; one of what c3
learnt from moves serving back to c2 (the newest promoted checkpoint not affected), not to c1 nor to
the unpromoted c4; a task takes its step scores and only its group. Each test names the planted bug it
was seen failing against (tools/mutants/catalog/retraction.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tentalis_pipelines import audit, retraction
from tentalis_pipelines.lakehouse import Lakehouse
from tentalis_pipelines.training import serving
from tests.chain_rows import build_chain


@pytest.fixture
def chain(home: Path) -> Lakehouse:
    return build_chain(home)


def test_retracting_a_review_of_the_oldest_checkpoint_taints_its_whole_line(chain):
    """A review c1 trained on: c1 direct, c2, c3, c4 inherited (audit rows), x1 untouched; c3 served, so
    serving falls to the base (every promoted checkpoint is affected). Mutants retraction-no-taint-rows."""
    out = retraction.retract(chain, review="b1/b1-t0-r0/verifier", reason="withdrawn", actor="alice")
    assert out.affected == {"c1": "direct", "c2": "inherited from c1", "c3": "inherited from c1", "c4": "inherited from c1"}
    assert {c: (audit.tainted(chain, c) or {}).get("from_state") for c in ("c1", "c2", "c3", "c4", "x1")} == {
        "c1": "review b1/b1-t0-r0/verifier", "c2": "review b1/b1-t0-r0/verifier", "c3": "review b1/b1-t0-r0/verifier",
        "c4": "review b1/b1-t0-r0/verifier", "x1": None}
    assert (out.serving_before, out.serving_after) == ("c3", "base") and serving.serving_checkpoint(chain) == "base"


def test_retracting_a_review_takes_its_group_and_moves_serving_to_the_newest_clean_promoted(chain):
    """A human review of b3's first rollout: its task's group of four trajectories goes (their advantages
    were normalised with its score), t1's stay; the human source row goes; c3 learnt from those
    trajectories (its manifest has no reviews), so serving moves to c2: newer than c1, promoted unlike c4.
    Mutants retraction-no-group, retraction-human-source-kept, retraction-reviews-only-taint,
    retraction-fallback-oldest, retraction-fallback-unpromoted, retraction-predicate-and."""
    out = retraction.retract(chain, review="b3/b3-t0-r0/human", reason="withdrawn", actor="alice")
    assert out.trajectory_ids == [f"b3-t0-r{i}" for i in range(4)]
    assert out.deleted["trajectories"] == 4 and out.deleted["reviews"] == 1 and out.deleted["human_reviews"] == 1
    assert sorted(r["rollout_id"] for r in chain.read("trajectories", batch_id="b3").to_pylist()) == ["b3-t1-r0", "b3-t1-r1"]
    assert chain.read("human_reviews").num_rows == 0
    assert out.affected == {"c3": "direct"}
    assert (out.serving_before, out.serving_after) == ("c3", "c2") and serving.serving_checkpoint(chain) == "c2"


def test_retracting_a_task_takes_its_step_scores_and_only_its_group(chain):
    """Mutant retraction-task-step-scores-kept; the other task's rows stay."""
    out = retraction.retract(chain, task="t1", reason="leaked", actor="alice")
    for name in ("rollouts", "step_scores", "reviews", "trajectories"):
        left = sorted(r["rollout_id"] for r in chain.read(name, batch_id="b2").to_pylist())
        assert left == [f"b2-t0-r{i}" for i in range(4)], name
    assert out.deleted["step_scores"] == 6 and out.deleted["tasks"] == 3
    # Every checkpoint trained on some t1 trajectory: all are affected, directly.
    assert set(out.affected) == {"c1", "c2", "c3", "c4", "x1"}
