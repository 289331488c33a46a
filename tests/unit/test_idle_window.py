"""Idle windows without a model: the activity file, the idle hours, and the idle_window sensor's decisions."""

from __future__ import annotations

import os
import time
from datetime import datetime, timezone

import pytest
from dagster import DagsterInstance, RunRequest, SkipReason, build_sensor_context

from assets.resources import LakehouseResource, TrainerResource
from jobs.sensors import idle_window
from tentalis_pipelines import activity
from tentalis_pipelines.lakehouse import Lakehouse, now_utc
from tentalis_pipelines.settings import Paths
from tentalis_pipelines.stages.idle_window import in_hours, parse_hours, progress_path


def test_the_activity_file_records_the_last_request(tmp_path):
    path = activity.activity_path(tmp_path)
    assert activity.last_activity_ns(path) is None and activity.idle_seconds(path) is None
    activity.touch(path)
    first = activity.last_activity_ns(path)
    assert activity.idle_seconds(path) < 5
    os.utime(path, ns=(first - 120 * 10**9, first - 120 * 10**9))
    assert activity.idle_seconds(path) == pytest.approx(120, abs=5)


def test_the_recorder_touches_on_begin_and_end_and_beats_while_in_flight(tmp_path):
    path = activity.activity_path(tmp_path)
    rec = activity.ActivityRecorder(path, heartbeat_s=0.05).start()
    try:
        rec.begin()
        t1 = activity.last_activity_ns(path)
        time.sleep(0.3)
        t2 = activity.last_activity_ns(path)
        assert t2 > t1  # a long request keeps the box busy
        rec.end()
        t3 = activity.last_activity_ns(path)
        time.sleep(0.2)
        assert activity.last_activity_ns(path) == t3 and rec.in_flight == 0  # no beat once idle
    finally:
        rec.stop()


def test_idle_hours_parse_and_wrap_midnight():
    assert parse_hours("") is None and parse_hours("22:00-06:30") == (22 * 60, 6 * 60 + 30)
    at = lambda h, m: datetime(2025, 1, 1, h, m, tzinfo=timezone.utc)  # noqa: E731
    assert in_hours(at(23, 0), "22:00-06:00") and in_hours(at(5, 59), "22:00-06:00")
    assert not in_hours(at(6, 0), "22:00-06:00") and not in_hours(at(12, 0), "22:00-06:00")
    assert in_hours(at(9, 0), "09:00-17:00") and not in_hours(at(17, 0), "09:00-17:00")
    assert in_hours(at(12, 0), "")
    for bad in ("22-06", "25:00-01:00", "10:00-10:00", "ten"):
        with pytest.raises(ValueError, match="idle_hours"):
            parse_hours(bad)


@pytest.fixture()
def instance():
    with DagsterInstance.ephemeral() as inst:
        yield inst


def _sensor(instance, home, **trainer):
    ctx = build_sensor_context(instance=instance, resources={"lakehouse": LakehouseResource(home=str(home)),
                                                             "trainer": TrainerResource(**trainer)})
    return idle_window(ctx)


def _fresh(home, n: int) -> None:
    lake = Lakehouse(Paths.from_env(home).ensure().lakehouse)
    lake.write_batch("trajectories", "b1", [{"batch_id": "b1", "rollout_id": f"r{i}", "task_id": "t", "group_index": i,
                                             "policy_version": "base", "advantage": 1.0, "kept": True, "created_at": now_utc()}
                                            for i in range(n)])


def test_the_sensor_opens_a_window_only_when_idle_long_enough_with_work(instance, home):
    paths = Paths.from_env(home).ensure()
    marker = activity.activity_path(paths.home)
    _fresh(home, 3)
    activity.touch(marker)
    got = _sensor(instance, home, idle_minutes=1, fresh_trajectory_threshold=2)
    assert isinstance(got, SkipReason) and "served" in got.skip_message
    stamp = activity.last_activity_ns(marker) - 90 * 10**9
    os.utime(marker, ns=(stamp, stamp))  # 90 s quiet
    got = _sensor(instance, home, idle_minutes=1, fresh_trajectory_threshold=2)
    assert isinstance(got, RunRequest)
    assert got.run_config["ops"]["training_windows"]["config"]["idle_since_ns"] == stamp  # the run yields once it moves
    assert got.run_key.startswith(f"idle-{stamp}-")
    # Too little work, and no saved progress: no window.
    got = _sensor(instance, home, idle_minutes=1, fresh_trajectory_threshold=5)
    assert isinstance(got, SkipReason) and "3 fresh trajectories" in got.skip_message
    # A saved progress is work enough: the window resumes it.
    progress_path(paths).parent.mkdir(parents=True, exist_ok=True)
    progress_path(paths).write_bytes(b"x")
    assert isinstance(_sensor(instance, home, idle_minutes=1, fresh_trajectory_threshold=5), RunRequest)


def test_the_sensor_keeps_to_the_idle_hours(instance, home):
    _fresh(home, 3)  # never served: idle
    now = datetime.now(timezone.utc)
    outside = f"{(now.hour + 2) % 24:02d}:00-{(now.hour + 3) % 24:02d}:00"
    inside = f"{now.hour:02d}:00-{(now.hour + 1) % 24:02d}:00"
    got = _sensor(instance, home, idle_minutes=0, fresh_trajectory_threshold=1, idle_hours=outside)
    assert isinstance(got, SkipReason) and "outside" in got.skip_message
    assert isinstance(_sensor(instance, home, idle_minutes=0, fresh_trajectory_threshold=1, idle_hours=inside), RunRequest)
