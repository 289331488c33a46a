"""When the gateway last served a model request: the state that idle-window training reads.

The gateway touches one file, ``$TENTALIS_HOME/gateway/last_request``, when a model request arrives,
every ``HEARTBEAT_S`` while any is in flight (a long decode is activity too), and when the last one ends.
The file's modification time *is* the state: ``os.utime`` is atomic, costs a few microseconds, and any
process on the box (the Dagster sensor, a training run) reads it with one ``stat``. Several gateway
processes on one box share the file; the newest touch wins, which is what "idle" needs.

Only model work counts (``/v1/chat/completions``, ``/v1/completions``): health checks, ``/v1/models``
and reviews never wake the box, or a monitor's pings would keep training from ever starting.

The file is per machine (a local path), which is what "serving and learning on one box" means: a
gateway on another machine does not stop this machine's training.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

ACTIVITY_FILE = "last_request"
# While a request is in flight the gateway touches the file this often, so a decode longer than the
# idle threshold still reads as activity, and a training run polling the file sees it within this bound.
HEARTBEAT_S = 1.0
# The request paths that count as activity (model work).
MODEL_PATHS = ("/v1/chat/completions", "/v1/completions")


def activity_path(home: str | os.PathLike[str]) -> Path:
    """The activity file of the gateway whose home is ``home`` (``$TENTALIS_HOME``)."""
    return Path(home) / "gateway" / ACTIVITY_FILE


def last_activity_ns(path: Path) -> int | None:
    """When the gateway last served (ns since the epoch), or None when no gateway has served here yet."""
    try:
        return os.stat(path).st_mtime_ns
    except FileNotFoundError:
        return None


def idle_seconds(path: Path, now: float | None = None) -> float | None:
    """Seconds since the last model request, or None when no gateway has served here yet."""
    last = last_activity_ns(path)
    if last is None:
        return None
    return max(0.0, (time.time() if now is None else now) - last / 1e9)


def touch(path: Path) -> None:
    """Record activity now (creates the file and its folder the first time)."""
    now = time.time_ns()
    try:
        os.utime(path, ns=(now, now))
    except FileNotFoundError:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()
        os.utime(path, ns=(now, now))


class ActivityRecorder:
    """The gateway's side: ``begin()`` / ``end()`` around each model request; a heartbeat thread keeps
    touching the file while any request is in flight. A failing touch (disk full, read-only home) is
    counted in ``errors`` and never fails a request: serving matters more than the idle signal."""

    def __init__(self, path: Path, heartbeat_s: float = HEARTBEAT_S):
        self.path, self.heartbeat_s = Path(path), heartbeat_s
        self.in_flight = 0
        self.errors = 0
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._stop = False
        self._thread: threading.Thread | None = None

    def _touch(self) -> None:
        try:
            touch(self.path)
        except OSError:
            self.errors += 1

    def begin(self) -> None:
        self._touch()  # first, before any work: a training run polling the file yields now
        with self._lock:
            self.in_flight += 1
            self._wake.notify()

    def end(self) -> None:
        with self._lock:
            self.in_flight = max(0, self.in_flight - 1)
        self._touch()  # idle time counts from the end of the last request

    def start(self) -> ActivityRecorder:
        if self._thread is None:
            self._thread = threading.Thread(target=self._heartbeat, name="tentalis-activity", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        """End the heartbeat thread, waiting 5 s at most for it (a touch stuck on a stalled disk must not
        hang the gateway's shutdown: the thread is a daemon and is left behind)."""
        with self._lock:
            self._stop = True
            self._wake.notify()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _heartbeat(self) -> None:
        with self._lock:
            while not self._stop:
                if self.in_flight == 0:
                    self._wake.wait()
                    continue
                self._wake.wait(self.heartbeat_s)
                if self.in_flight and not self._stop:
                    self._lock.release()
                    try:
                        self._touch()
                    finally:
                        self._lock.acquire()


class ActivityMiddleware:
    """Pure ASGI middleware: model requests call ``recorder.begin()`` when they arrive and ``end()``
    once their last byte is sent (a streamed reply counts as activity until ``[DONE]``)."""

    def __init__(self, app, recorder: ActivityRecorder):
        self.app, self.recorder = app, recorder

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope.get("path") not in MODEL_PATHS:
            return await self.app(scope, receive, send)
        self.recorder.begin()
        try:
            await self.app(scope, receive, send)
        finally:
            self.recorder.end()
