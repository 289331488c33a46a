"""Lineage over a chain of three checkpoints, written by hand (no model; tests/chain_rows.py): the cases a
fixture with one checkpoint never reaches (issue #33): the ancestors of a third generation, the taint
of every descendant, the pinned versions, the newest manifest, the training order and the digest. Each
test names the planted bug it was seen failing against (tools/mutants/catalog/lineage.py).
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from tentalis_pipelines import lineage
from tentalis_pipelines.lakehouse import Lakehouse
from tentalis_pipelines.training.trainer import TrainSample
from tests.chain_rows import T0, build_chain, manifest


@pytest.fixture
def chain(home: Path) -> Lakehouse:
    return build_chain(home)


# --------------------------------------------------------------------------- lineage
def test_ancestors_follow_the_chain_to_the_base(chain):
    """Mutant lineage-ancestors-parent-only: a chain of one."""
    assert lineage.ancestors(chain, "c3") == ["c3", "c2", "c1"]
    assert lineage.ancestors(chain, "c4") == ["c4", "c2", "c1"]
    assert lineage.ancestors(chain, None) == []


def test_checkpoints_using_taints_every_descendant_and_no_ancestor_or_sibling(chain):
    """Mutants lineage-taint-children-only (grandchildren missed), lineage-unrecorded-checkpoint."""
    assert lineage.checkpoints_using(chain, reviews=["b1/b1-t0-r0/verifier"]) == {
        "c1": "direct", "c2": "inherited from c1", "c3": "inherited from c1", "c4": "inherited from c1"}
    # b2 taught c2, x1 and c4; c3 descends from c2; c1 (c2's parent) is untouched.
    assert lineage.checkpoints_using(chain, trajectories=["b2-t1-r1"]) == {
        "x1": "direct", "c2": "direct", "c4": "direct", "c3": "inherited from c2"}


def test_used_reviews_are_read_at_the_pinned_version(chain):
    """Mutant lineage-reviews-current-version: a review written after training was pinned is not in
    the manifest."""
    pinned = chain.table("reviews").version()
    rows = chain.read("reviews", batch_id="b1").to_pylist()
    chain.write_batch("reviews", "b1", rows + [{**rows[0], "manager": "late-judge"}])
    trajs = [t for t in chain.read("trajectories", batch_id="b1").to_pylist() if t["rollout_id"] == "b1-t0-r0"]
    keys = [lineage.review_key(r) for r in lineage.used_reviews(chain, trajs, {}, pinned)]
    assert keys == ["b1/b1-t0-r0/verifier"]
    now = [lineage.review_key(r) for r in lineage.used_reviews(chain, trajs, {}, chain.table("reviews").version())]
    assert now == ["b1/b1-t0-r0/late-judge", "b1/b1-t0-r0/verifier"]


def test_the_manifest_lists_only_non_blank_hints_and_used_opd_hints(chain, monkeypatch):
    """Mutants lineage-blank-hints, lineage-opd-any-decision, lineage-opd-row-id."""
    monkeypatch.setattr(lineage, "code_version", lambda: {"git_commit": "abc"})
    chain.write_batch("teacher_logprobs", "b1", [
        {"batch_id": "b1", "rollout_id": f"b1-t0-r{i}", "hint_id": f"h{i}", "decision": d, "created_at": T0}
        for i, d in ((0, "used"), (2, "no_effect"))])
    trajs = chain.read("trajectories", batch_id="b1").to_pylist()
    trajs = [{**t, "opd_signal": [0.1] if t["rollout_id"] in ("b1-t0-r0", "b1-t0-r2") else None} for t in trajs]
    versions = lineage.table_versions(chain)
    m = lineage.build_manifest(chain, checkpoint_id="c9", parent_id="c3", policy_version="c3", versions=versions, trajectories=trajs,
                               rollouts={}, samples=[], config={}, base_model="m", model="m")
    # Hints on r0 and r2 of each group; r1's is blank.
    assert [h["review_key"] for h in m["hints"]] == ["b1/b1-t0-r0/verifier", "b1/b1-t0-r2/verifier", "b1/b1-t1-r0/verifier"]
    assert m["opd_hints"] == [{"batch_id": "b1", "hint_id": "h0", "rollout_id": "b1-t0-r0"}]
    assert m["ancestors"] == ["c3", "c2", "c1"]
    opd_rows = [r for r in lineage.lineage_rows(m) if r["kind"] == "opd_hint"]
    assert [(r["row_id"], r["batch_id"], r["table_version"]) for r in opd_rows] == [("h0", "b1", versions["teacher_logprobs"])]


def test_table_versions_include_optional_tables_once_they_exist(chain):
    """Mutant lineage-optional-tables-skipped."""
    assert "teacher_logprobs" not in lineage.table_versions(chain)
    chain.write_batch("teacher_logprobs", "b1", [{"batch_id": "b1", "rollout_id": "b1-t0-r0", "decision": "no_hint", "created_at": T0}])
    v = lineage.table_versions(chain)
    assert v["teacher_logprobs"] == chain.table("teacher_logprobs").version() and v["reviews"] == chain.table("reviews").version()


def test_the_newest_manifest_of_a_checkpoint_is_loaded(chain):
    """Mutant lineage-first-manifest: a checkpoint recorded three times (retried runs) reads the newest by
    its time, which is neither the first nor the last row in the table's order, whichever way it reads."""
    def again(digest: str, hours: float) -> None:
        (row,) = [r for r in lineage.lineage_rows({**manifest("c2", "b3"), "samples_digest": digest}) if r["kind"] == "manifest"]
        chain.append("lineage", [{**row, "created_at": row["created_at"] + timedelta(hours=hours)}])

    again("newest", 1)
    again("stale", -2)
    assert lineage.load_manifest(chain, "c2")["samples_digest"] == "newest"
    assert lineage.load_manifest(chain, "c1")["trajectories"][0]["rollout_id"] == "b1-t0-r0"


def test_training_order_keeps_groups_by_index_not_by_rollout_id():
    """Mutant lineage-order-by-rollout-id: group indexes 2 and 10 (rollout ids sort '...-10' first)."""
    rows = [{"batch_id": "b", "task_id": "t", "group_index": g, "rollout_id": f"r-{g}"} for g in (10, 2, 0)]
    rows.append({"batch_id": "a", "task_id": None, "group_index": None, "rollout_id": "z"})
    assert [r["rollout_id"] for r in lineage.order_trajectories(rows)] == ["z", "r-0", "r-2", "r-10"]


@pytest.mark.parametrize("field, value", [("temperature", 0.71), ("loss_mask", [1, 0]), ("old_logps", [-1.0, -2.5]),
                                          ("token_advantages", [0.5, 0.25]), ("advantage", 0.5000001)])
def test_the_digest_changes_with_each_field_of_a_sample(field, value):
    """Mutants lineage-digest-no-temperature, lineage-digest-no-loss-mask."""
    base = TrainSample(prompt_ids=[1, 2], completion_ids=[3, 4], advantage=0.5, token_advantages=[0.5, 0.5],
                       old_logps=[-1.0, -2.0], temperature=0.7, loss_mask=[1, 1])
    changed = TrainSample(**{**base.__dict__, field: value})
    assert lineage.samples_digest([base]) != lineage.samples_digest([changed])
