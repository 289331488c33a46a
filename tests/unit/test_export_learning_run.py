"""The learning-run export records the code that trained each checkpoint (tentalis_pipelines/evaluation/learning_runs.py, `tentalis export-curve`)."""

import json
from datetime import UTC, datetime

from tentalis_pipelines.evaluation.learning_runs import checkpoint_commits
from tentalis_pipelines.lakehouse import Lakehouse


def _manifest(checkpoint_id: str, code: dict | None) -> dict:
    detail = {"checkpoint_id": checkpoint_id}
    if code is not None:
        detail["code_version"] = code
    return {"checkpoint_id": checkpoint_id, "kind": "manifest", "table_name": None, "table_version": None, "row_id": None,
            "batch_id": None, "detail": json.dumps(detail), "created_at": datetime(2026, 11, 23, tzinfo=UTC)}


def test_checkpoint_commits_come_from_each_checkpoints_lineage(tmp_path):
    lake = Lakehouse(tmp_path / "lakehouse")
    assert checkpoint_commits(lake) == {}  # a home without lineage: the caller's fallback decides
    trajectory = {**_manifest("ckpt-a", None), "kind": "trajectory", "table_name": "trajectories", "row_id": "r1",
                  "detail": json.dumps({"code_version": {"git_commit": "f" * 40, "git_dirty": False}})}
    lake.append("lineage", [
        _manifest("ckpt-a", {"git_commit": "bdb2e7ef32814d119b9b4229f1c39849d5bc8b98", "git_dirty": False}),
        _manifest("ckpt-b", {"git_commit": "d857a44aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", "git_dirty": True}),
        _manifest("ckpt-c", {"git_commit": None, "git_dirty": None, "package_version": "0.1.0"}),  # not a checkout
        trajectory,  # not a manifest: ignored even though its detail looks like one
    ])
    assert checkpoint_commits(lake) == {"ckpt-a": "bdb2e7e", "ckpt-b": "d857a44+dirty"}
