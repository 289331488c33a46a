"""Lineage and retraction over a chain of three checkpoints, written by hand (no model): the cases a
fixture with one checkpoint never reaches (issue #33). The chain is

    c1 (trained on b1)  <-  c2 (on b2)  <-  c3 (on b3, serving)       c4: child of c2, never promoted
    x1 (on b2, from the base: a sibling line)

so a retraction of what c1 learnt from taints c2 and c3 (inherited) but not x1; one of what c3 learnt
from moves serving back to c2 (the newest promoted checkpoint not affected), not to c1 nor to the
unpromoted c4. Each test names the planted bug it was seen failing against (tools/mutants/catalog/
lineage.py and retraction.py).
"""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest

from tentalis_pipelines import audit, lineage, retraction
from tentalis_pipelines.lakehouse import Lakehouse, now_utc
from tentalis_pipelines.settings import Paths
from tentalis_pipelines.training import checkpoints as ckpt
from tentalis_pipelines.training import serving
from tentalis_pipelines.training.trainer import TrainSample

T0 = now_utc() - timedelta(hours=1)


def _batch(lake: Lakehouse, batch_id: str, *, human: bool = False) -> None:
    """Two tasks: t0 with a group of four rollouts, t1 with two; a review per rollout (hints on r0 and r2,
    a blank one on r1) and its step score."""
    groups = {"t0": 4, "t1": 2}
    rows = [(task, i, f"{batch_id}-{task}-r{i}") for task, n in groups.items() for i in range(n)]
    lake.write_batch("tasks", batch_id, [{"batch_id": batch_id, "task_id": t, "source": "test", "prompt": f"q {t}", "reference": "1",
                                          "metadata": "{}", "created_at": T0} for t in groups])
    lake.write_batch("rollouts", batch_id, [{"batch_id": batch_id, "rollout_id": rid, "task_id": t, "group_index": i,
                                             "prompt_text": f"q {t}", "completion": "x", "created_at": T0} for t, i, rid in rows])
    lake.write_batch("step_scores", batch_id, [{"batch_id": batch_id, "rollout_id": rid, "step_index": 0, "step_text": "x",
                                                "scorer": "verifier", "score": 0.0, "votes": [], "rationale": ""} for _, _, rid in rows])
    lake.write_batch("reviews", batch_id, [{
        "batch_id": batch_id, "rollout_id": rid, "manager": "human" if human and i == 0 and t == "t0" else "verifier",
        "score": float(i == 0), "critique": f"critique {rid}", "hint": {0: f"hint {rid}", 1: "   ", 2: f"hint {rid}"}.get(i, ""),
        "created_at": T0} for t, i, rid in rows])
    lake.write_batch("trajectories", batch_id, [{"batch_id": batch_id, "rollout_id": rid, "task_id": t, "group_index": i,
                                                 "advantage": 1.0 if i == 0 else -0.5, "kept": True, "created_at": T0}
                                                for t, i, rid in rows])
    if human:
        lake.append("human_reviews", [{"rollout_id": f"{batch_id}-t0-r0", "batch_id": batch_id, "reviewer": "dana", "score": 1.0,
                                       "critique": "c", "hint": "h", "source": "r.jsonl", "line": 1, "imported_at": T0}])


def _manifest(cid: str, batch: str, *, trajectories: bool = True, reviews: bool = True) -> dict:
    rids = [f"{batch}-t0-r{i}" for i in range(4)] + [f"{batch}-t1-r{i}" for i in range(2)]
    return {"checkpoint_id": cid, "tables": {"reviews": 1, "trajectories": 1},
            "trajectories": [{"batch_id": batch, "rollout_id": r} for r in rids] if trajectories else [],
            "reviews": [{"batch_id": batch, "review_key": f"{batch}/{r}/verifier"} for r in rids] if reviews else [],
            "hints": [], "skills": [], "opd_hints": []}


def _checkpoint(lake: Lakehouse, tmp: Path, cid: str, parent: str | None, minute: int, manifest: dict) -> None:
    folder = tmp / "adapters" / cid
    folder.mkdir(parents=True)
    (folder / ckpt.MARKER).write_text(json.dumps({"files": []}))
    lineage.record(lake, manifest)
    lake.append("checkpoints", [{"checkpoint_id": cid, "parent_id": parent, "base_model": "m", "adapter_uri": str(folder),
                                 "algorithm": "grpo", "config": "{}", "trained_on": [], "trajectory_ids": [], "trajectory_count": 0,
                                 "metrics": "{}", "promoted": False, "created_at": T0 + timedelta(minutes=minute)}])


@pytest.fixture
def chain(home: Path) -> Lakehouse:
    lake = Lakehouse(Paths.from_env(home).ensure().lakehouse)
    for b in ("b1", "b2", "b3"):
        _batch(lake, b, human=b == "b3")
    _checkpoint(lake, home, "c1", None, 1, _manifest("c1", "b1"))
    _checkpoint(lake, home, "x1", None, 2, _manifest("x1", "b2"))
    _checkpoint(lake, home, "c2", "c1", 3, _manifest("c2", "b2"))
    # c3 lists its trajectories but not the reviews (a manifest from before reviews were recorded).
    _checkpoint(lake, home, "c3", "c2", 4, _manifest("c3", "b3", reviews=False))
    _checkpoint(lake, home, "c4", "c2", 5, _manifest("c4", "b2"))
    for cid in ("c1", "c2", "c3"):
        serving.promote(lake, cid, actor="test", reason="chain")
        serving.mark_promoted(lake, cid)
    # A training run that crashed after recording its lineage and before its checkpoint row.
    lineage.record(lake, _manifest("crashed", "b1"))
    return lake


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
    """Mutant lineage-first-manifest: a checkpoint recorded twice (a retried run) reads its newest manifest."""
    lineage.record(chain, {**_manifest("c2", "b3"), "samples_digest": "second"})
    assert lineage.load_manifest(chain, "c2")["samples_digest"] == "second"
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


# --------------------------------------------------------------------------- retraction
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
