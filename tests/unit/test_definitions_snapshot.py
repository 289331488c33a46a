"""A snapshot of the Dagster definitions: every change to the graph shows up in review.

    UPDATE_SNAPSHOTS=1 .venv/bin/python -m pytest tests/test_definitions_snapshot.py   # after a deliberate change
"""

from __future__ import annotations

import json
import os
from pathlib import Path

SNAPSHOT = Path(__file__).resolve().parents[1] / "snapshots" / "definitions.json"


def _partitions(node) -> str | None:
    p = node.partitions_def
    if p is None:
        return None
    return getattr(p, "name", None) or type(p).__name__


def _pool(node) -> str | None:
    if not node.is_materializable:
        return None
    return getattr(node.assets_def.node_def, "pool", None)


def graph_snapshot() -> dict:
    from tentalis_pipelines.definitions import defs

    graph = defs.resolve_asset_graph()
    assets = {}
    for key in sorted(graph.get_all_asset_keys(), key=lambda k: k.to_user_string()):
        node = graph.get(key)
        assets[key.to_user_string()] = {
            "deps": sorted(k.to_user_string() for k in node.parent_keys),
            "partitions": _partitions(node),
            "group": node.group_name,
            "materializable": node.is_materializable,
            "pool": _pool(node),
            "checks": sorted(c.name for c in node.check_keys),
        }
    return {
        "assets": assets,
        "jobs": sorted(j.name for j in defs.resolve_all_job_defs() if not j.name.startswith("__")),
        "sensors": {s.name: {"job": s.job_name, "default_status": s.default_status.value} for s in defs.sensors},
        "schedules": {s.name: {"job": s.job_name, "cron": s.cron_schedule, "default_status": s.default_status.value}
                      for s in defs.schedules},
    }


def test_definitions_match_the_snapshot(monkeypatch):
    monkeypatch.delenv("TENTALIS_AUTOMATION", raising=False)
    current = graph_snapshot()
    if os.environ.get("UPDATE_SNAPSHOTS") == "1":
        SNAPSHOT.write_text(json.dumps(current, indent=2, sort_keys=True) + "\n")
    assert current == json.loads(SNAPSHOT.read_text()), "the Dagster graph changed: review it, then UPDATE_SNAPSHOTS=1"


def test_the_graph_shows_where_data_fans_in():
    """Each asset declares every table it reads (issue 12): the UI's graph is the data flow."""
    assets = graph_snapshot()["assets"]
    assert assets["trajectories"]["deps"] == ["guided_rollouts", "reviews", "reward_activations", "rollouts", "step_scores", "tasks",
                                              "teacher_logprobs"]
    assert assets["teacher_logprobs"]["deps"] == ["reviews", "rollouts", "tasks"]
    assert assets["guided_rollouts"]["deps"] == ["reviews", "rollouts", "step_scores", "tasks"]
    assert assets["reviews"]["deps"] == ["human_reviews", "rollouts", "step_scores", "tasks"]
    assert assets["checkpoints"]["deps"] == ["grounding_flags", "guided_rollouts", "rollouts", "trajectories"]
    assert not assets["human_reviews"]["materializable"]  # written by `tentalis import-reviews`
    assert not assets["reward_activations"]["materializable"]  # written by `tentalis rescore --activate`
    assert assets["reward_versions"]["deps"] == ["reviews", "rollouts", "step_scores", "tasks", "trajectories"]
    assert assets["judge_agreement"]["deps"] == ["human_reviews", "reviews", "reward_versions"]


def test_model_work_is_opt_in(monkeypatch):
    """Sensors and schedules that load a model start STOPPED unless TENTALIS_AUTOMATION=on."""
    import pytest

    from jobs.sensors import automation_on, automation_sensor_status

    monkeypatch.delenv("TENTALIS_AUTOMATION", raising=False)
    snap = graph_snapshot()
    launching = {n: s for n, s in {**snap["sensors"], **snap["schedules"]}.items() if n != "weekly_lakehouse_maintenance"}
    assert launching and all(s["default_status"] == "STOPPED" for s in launching.values()), launching
    monkeypatch.setenv("TENTALIS_AUTOMATION", "on")
    assert automation_on() and automation_sensor_status().value == "RUNNING"
    monkeypatch.setenv("TENTALIS_AUTOMATION", "sometimes")
    with pytest.raises(ValueError, match="TENTALIS_AUTOMATION"):
        automation_on()


def test_every_table_asset_shows_its_columns_and_name():
    """Standard table metadata (issue 12): the UI lists each Delta table's columns before any run."""
    from tentalis_pipelines.definitions import defs
    from tentalis_pipelines.schemas import SCHEMAS, column_descriptions

    graph = defs.resolve_asset_graph()
    tables = [k for k in graph.get_all_asset_keys() if k.to_user_string() in SCHEMAS]
    assert len(tables) >= 8
    for key in tables:
        name = key.to_user_string()
        meta = graph.get(key).metadata
        columns = [c.name for c in meta["dagster/column_schema"].columns]
        assert columns == SCHEMAS[name].names, name
        assert {c.name: c.description for c in meta["dagster/column_schema"].columns} == column_descriptions(name), name
        assert meta["dagster/table_name"] == f"lakehouse.{name}"
        # Text, not a path: the asset page's "Storage" renders a path value as an empty link (tests/test_ui.py).
        assert meta["dagster/uri"].text.endswith(f"/lakehouse/{name}"), name
