"""The gateway's side of idle windows (tentalis_pipelines/activity.py), from its docstrings: the file's
place, idle seconds against a given clock (never negative), the first touch making the folders, the
recorder counting failed touches without failing a request and keeping its count of requests in flight
at zero or above, one heartbeat thread, and the middleware waking the box for model work only. Written
from the mutmut target ``idle_activity``'s survivors (tools/mutants/reports/idle_activity.md)."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from pathlib import Path

import pytest

from tentalis_pipelines import activity


def _threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "tentalis-activity"]


def test_the_file_is_last_request_in_the_gateway_folder_of_home(tmp_path):
    assert activity.activity_path(tmp_path) == tmp_path / "gateway" / "last_request"
    assert activity.activity_path(str(tmp_path)) == tmp_path / "gateway" / "last_request"


def test_idle_seconds_count_from_the_last_touch_to_the_clock_given_and_never_below_zero(tmp_path):
    path = activity.activity_path(tmp_path)
    assert activity.idle_seconds(path, now=123.0) is None  # no gateway has served here yet
    activity.touch(path)
    os.utime(path, ns=(1_000_000_000_000, 1_000_000_000_000))  # 1000 s after the epoch
    assert activity.last_activity_ns(path) == 1_000_000_000_000
    assert activity.idle_seconds(path, now=1010.5) == pytest.approx(10.5)
    assert activity.idle_seconds(path, now=1000.0) == 0.0
    assert activity.idle_seconds(path, now=990.0) == 0.0  # a clock behind the file: idle 0, not negative
    assert activity.idle_seconds(path) == pytest.approx(time.time() - 1000.0, abs=5)  # no clock given: now


def test_the_first_touch_makes_the_folders_and_every_touch_stamps_now(tmp_path):
    path = tmp_path / "home" / "gateway" / "last_request"  # neither folder exists yet
    before = time.time_ns()
    activity.touch(path)
    assert before <= activity.last_activity_ns(path) <= time.time_ns()
    os.utime(path, ns=(10**9, 10**9))
    before = time.time_ns()
    activity.touch(path)
    assert before <= activity.last_activity_ns(path) <= time.time_ns()


def test_a_failing_touch_is_counted_and_never_fails_a_request(tmp_path):
    (tmp_path / "gateway").write_text("a file where the folder should be")
    rec = activity.ActivityRecorder(activity.activity_path(tmp_path))
    rec.begin()
    assert (rec.errors, rec.in_flight) == (1, 1)
    rec.end()
    assert (rec.errors, rec.in_flight) == (2, 0)


def test_requests_in_flight_are_counted_and_never_below_zero(tmp_path):
    path = activity.activity_path(tmp_path)
    rec = activity.ActivityRecorder(path)
    rec.end()  # an end without its begin
    assert rec.in_flight == 0 and rec.errors == 0 and activity.last_activity_ns(path) is not None
    rec.begin()
    rec.begin()
    rec.end()
    assert rec.in_flight == 1
    rec.end()
    rec.end()
    assert rec.in_flight == 0


def _stamps_change(path, times: int) -> bool:
    """Whether the file's stamp moves ``times`` times, each within 2 s."""
    for _ in range(times):
        last, deadline = activity.last_activity_ns(path), time.monotonic() + 2.0
        while activity.last_activity_ns(path) == last:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.005)
    return True


def test_the_heartbeat_keeps_beating_while_one_request_is_in_flight(tmp_path):
    path = activity.activity_path(tmp_path)
    rec = activity.ActivityRecorder(path, heartbeat_s=0.02).start()
    try:
        rec.begin()
        assert _stamps_change(path, 3)  # a long decode: beat after beat, not once
        rec.begin()
        rec.end()
        assert _stamps_change(path, 3)
        rec.end()
    finally:
        rec.stop()


def test_the_heartbeat_thread_never_keeps_the_gateway_alive_and_stop_waits_a_bounded_time(tmp_path, monkeypatch):
    rec = activity.ActivityRecorder(activity.activity_path(tmp_path), heartbeat_s=0.02)
    before = set(_threads())
    rec.start()
    (mine,) = set(_threads()) - before
    assert mine.daemon  # a gateway that exits without stop() does not hang on it
    waits = []
    join = mine.join
    monkeypatch.setattr(mine, "join", lambda timeout=None: (waits.append(timeout), join(timeout))[1])
    rec.stop()
    assert not mine.is_alive() and len(waits) == 1 and waits[0] is not None and waits[0] <= 5


def test_the_heartbeat_beats_while_any_request_is_in_flight_and_its_thread_is_one_and_stops(tmp_path):
    path = activity.activity_path(tmp_path)
    assert activity.ActivityRecorder(path).heartbeat_s == activity.HEARTBEAT_S
    rec = activity.ActivityRecorder(path, heartbeat_s=0.02)
    already = len(_threads())
    assert rec.start() is rec and rec.start() is rec
    assert len(_threads()) == already + 1  # started once
    try:
        rec.begin()
        rec.begin()
        rec.end()  # one of two still in flight: the box is busy
        t1 = activity.last_activity_ns(path)
        deadline = time.monotonic() + 2.0
        while activity.last_activity_ns(path) == t1 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert activity.last_activity_ns(path) > t1
        rec.end()
    finally:
        rec.stop()
    assert len(_threads()) == already
    activity.ActivityRecorder(path).stop()  # a recorder never started stops too


class _Recorder:
    def __init__(self):
        self.calls: list[str] = []

    def begin(self):
        self.calls.append("begin")

    def end(self):
        self.calls.append("end")


def _serve(scope, app_raises: bool = False) -> list[str]:
    rec = _Recorder()
    given = scope

    async def app(scope, receive, send):
        assert scope is given and receive is asked and send is sending  # passed through untouched
        rec.calls.append("app")
        await send({"type": "http.response.body", "body": b""})
        if app_raises:
            raise RuntimeError("the upstream broke")

    sent: list[dict] = []

    async def send(message):
        sent.append(message)

    async def receive():
        return {"type": "http.request"}

    asked, sending = receive, send
    asyncio.run(activity.ActivityMiddleware(app, rec)(scope, receive, send))
    assert sent == [{"type": "http.response.body", "body": b""}]
    return rec.calls


def test_the_middleware_wakes_the_box_for_model_work_only():
    for path in ("/v1/chat/completions", "/v1/completions"):
        assert _serve({"type": "http", "path": path}) == ["begin", "app", "end"]
    for path in ("/health", "/v1/models", "/v1/reviews", "/v1/chat/completions/", "/"):
        assert _serve({"type": "http", "path": path}) == ["app"]
    assert _serve({"type": "http"}) == ["app"]  # no path at all
    assert _serve({"type": "websocket", "path": "/v1/chat/completions"}) == ["app"]
    assert _serve({"type": "lifespan"}) == ["app"]


def test_a_model_request_that_fails_still_ends():
    with pytest.raises(RuntimeError, match="the upstream broke"):
        _serve({"type": "http", "path": "/v1/completions"}, app_raises=True)
    rec = _Recorder()

    async def app(scope, receive, send):
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        asyncio.run(activity.ActivityMiddleware(app, rec)({"type": "http", "path": "/v1/completions"}, None, None))
    assert rec.calls == ["begin", "end"]


def test_activity_path_accepts_any_path_like(tmp_path):
    class Home(os.PathLike):
        def __fspath__(self):
            return str(tmp_path)

    assert activity.activity_path(Home()) == Path(tmp_path) / "gateway" / "last_request"
