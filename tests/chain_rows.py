"""Rows of a chain of three checkpoints, written by hand (no model), for the lineage and retraction tests
(tests/test_lineage_chain.py, tests/test_retraction_chain.py). The chain is

    c1 (trained on b1)  <-  c2 (on b2)  <-  c3 (on b3, serving)       c4: child of c2, never promoted
    x1 (on b2, from the base: a sibling line)

plus the lineage rows of a training run that crashed before its checkpoint row ("crashed", on b1).
"""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

from tentalis_pipelines import lineage
from tentalis_pipelines.lakehouse import Lakehouse, now_utc
from tentalis_pipelines.settings import Paths
from tentalis_pipelines.training import checkpoints as ckpt
from tentalis_pipelines.training import serving

T0 = now_utc() - timedelta(hours=1)


def write_batch(lake: Lakehouse, batch_id: str, *, human: bool = False) -> None:
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


def manifest(cid: str, batch: str, *, trajectories: bool = True, reviews: bool = True) -> dict:
    rids = [f"{batch}-t0-r{i}" for i in range(4)] + [f"{batch}-t1-r{i}" for i in range(2)]
    return {"checkpoint_id": cid, "tables": {"reviews": 1, "trajectories": 1},
            "trajectories": [{"batch_id": batch, "rollout_id": r} for r in rids] if trajectories else [],
            "reviews": [{"batch_id": batch, "review_key": f"{batch}/{r}/verifier"} for r in rids] if reviews else [],
            "hints": [], "skills": [], "opd_hints": []}


def add_checkpoint(lake: Lakehouse, tmp: Path, cid: str, parent: str | None, minute: int, manifest: dict) -> None:
    folder = tmp / "adapters" / cid
    folder.mkdir(parents=True)
    (folder / ckpt.MARKER).write_text(json.dumps({"files": []}))
    lineage.record(lake, manifest)
    lake.append("checkpoints", [{"checkpoint_id": cid, "parent_id": parent, "base_model": "m", "adapter_uri": str(folder),
                                 "algorithm": "grpo", "config": "{}", "trained_on": [], "trajectory_ids": [], "trajectory_count": 0,
                                 "metrics": "{}", "promoted": False, "created_at": T0 + timedelta(minutes=minute)}])


def build_chain(home: Path) -> Lakehouse:
    """The chain above in the lakehouse of ``home`` (c1, c2, c3 promoted in turn: c3 serves)."""
    lake = Lakehouse(Paths.from_env(home).ensure().lakehouse)
    for b in ("b1", "b2", "b3"):
        write_batch(lake, b, human=b == "b3")
    add_checkpoint(lake, home, "c1", None, 1, manifest("c1", "b1"))
    add_checkpoint(lake, home, "x1", None, 2, manifest("x1", "b2"))
    add_checkpoint(lake, home, "c2", "c1", 3, manifest("c2", "b2"))
    # c3 lists its trajectories but not the reviews (a manifest from before reviews were recorded).
    add_checkpoint(lake, home, "c3", "c2", 4, manifest("c3", "b3", reviews=False))
    add_checkpoint(lake, home, "c4", "c2", 5, manifest("c4", "b2"))
    for cid in ("c1", "c2", "c3"):
        serving.promote(lake, cid, actor="test", reason="chain")
        serving.mark_promoted(lake, cid)
    # A training run that crashed after recording its lineage and before its checkpoint row.
    lineage.record(lake, manifest("crashed", "b1"))
    return lake


