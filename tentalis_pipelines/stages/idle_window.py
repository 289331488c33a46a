"""The `training_windows` stage: train while the gateway is idle, yield the moment a request arrives.

A window is one run of :func:`run_window`. It trains a checkpoint exactly as ``stages/training.py``
does, with two differences:

* it yields: the gateway's activity file (``tentalis_pipelines/activity.py``) is polled inside every
  forward and backward pass; once it moves past the value the window opened with (a model request
  arrived), or the configured hours end, the pass in flight is abandoned, the claim on the trajectories
  is given up (they stay fresh), and the run returns: no checkpoint is written, the ``gpu`` slot is free;
* it saves its progress every ``progress_every`` micro-steps (``training/progress.py``) in one file,
  ``$TENTALIS_HOME/training/idle_progress.pt``, and the next window resumes from it: the same pinned
  rows (the trajectory ids and table versions of the first window), the same order, the same RNG. A
  saved progress is dropped, and training starts over on today's fresh rows, when the serving policy
  moved, one of its rows was trained on by another run, or the rows or config no longer match.

Each window is a row of ``training_windows`` (idle minutes, trained minutes, micro-steps, steps,
outcome). The gateway is never stopped or reloaded: it serves the current policy all along, and a
finished window's checkpoint serves only once promoted (the gate, or ``trainer.promotion = always``).
"""

from __future__ import annotations

import re
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from tentalis_pipelines.activity import last_activity_ns
from tentalis_pipelines.lakehouse import Lakehouse, now_utc
from tentalis_pipelines.policy import PolicySettings
from tentalis_pipelines.settings import Paths
from tentalis_pipelines.stages.common import StageResult
from tentalis_pipelines.stages.training import train_checkpoint, trainable_trajectories
from tentalis_pipelines.training import checkpoints as ckpt
from tentalis_pipelines.training.cpu_priority import run_in_background
from tentalis_pipelines.training.progress import (
    Checkpointing,
    Preempted,
    Progress,
    ProgressStore,
    StaleProgress,
)
from tentalis_pipelines.training.serving import serving_checkpoint
from tentalis_pipelines.training.trainer import GRPOConfig

_HOURS = re.compile(r"^\s*(\d{1,2}):(\d{2})\s*-\s*(\d{1,2}):(\d{2})\s*$")


def progress_path(paths: Paths) -> Path:
    """Where an idle window's progress is saved between windows."""
    return paths.home / "training" / "idle_progress.pt"


def parse_hours(hours: str) -> tuple[int, int] | None:
    """``'HH:MM-HH:MM'`` (UTC; may wrap midnight, e.g. ``22:00-06:00``) as (start, end) minutes of the
    day, or None for an empty setting (any time). Anything else raises ValueError naming the setting."""
    if not hours.strip():
        return None
    m = _HOURS.match(hours)
    if not m:
        raise ValueError(f"trainer.idle_hours={hours!r}: write 'HH:MM-HH:MM' in UTC, e.g. '22:00-06:00', or leave it empty")
    h1, m1, h2, m2 = (int(x) for x in m.groups())
    if h1 > 23 or h2 > 23 or m1 > 59 or m2 > 59:
        raise ValueError(f"trainer.idle_hours={hours!r}: hours are 00-23 and minutes 00-59")
    start, end = h1 * 60 + m1, h2 * 60 + m2
    if start == end:
        raise ValueError(f"trainer.idle_hours={hours!r} is an empty window: leave it empty to allow any time")
    return start, end


def in_hours(when: datetime, hours: str) -> bool:
    """Whether ``when`` (UTC) lies inside ``hours`` (see :func:`parse_hours`; empty: always)."""
    window = parse_hours(hours)
    if window is None:
        return True
    start, end = window
    minute = when.hour * 60 + when.minute
    return start <= minute < end if start < end else minute >= start or minute < end


def _position(p: tuple[int, int, int] | None) -> str | None:
    return None if p is None else "/".join(str(x) for x in p)


@dataclass
class WindowRun:
    """What ``train_checkpoint`` asks of an idle window: which rows to train on (a saved run's, when it
    can resume), and how to checkpoint and yield while training."""

    store: ProgressStore
    every: int
    should_yield: Callable[[], bool]
    poll_s: float = 0.0
    resume: Progress | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    refused: int = 0
    discarded: str | None = None  # why a saved progress was dropped
    cp: Checkpointing | None = None

    def pin(self, lake: Lakehouse, version: str, versions: dict, fresh: list[dict], refused: int) -> tuple[dict, list[dict]]:
        """(table versions, rows) to train on: the saved run's when it is still valid, else ``fresh``."""
        self.refused = refused
        try:
            saved = self.store.load()
        except ValueError as exc:
            saved, self.discarded = None, str(exc)
            self.store.clear()
        if saved is not None:
            why = self._stale(lake, version, saved)
            if why is None:
                self.resume, versions = saved, dict(saved.meta["versions"])
                fresh = self._read_pinned(lake, versions, saved.meta["rollout_ids"])
            else:
                self.discarded = why
                self.store.clear()
        self.meta = {"policy_version": version, "versions": versions, "rollout_ids": [r["rollout_id"] for r in fresh]}
        return versions, fresh

    @staticmethod
    def _stale(lake: Lakehouse, version: str, saved: Progress) -> str | None:
        meta = saved.meta
        if meta.get("policy_version") != version:
            return f"the saved progress trained on {meta.get('policy_version')!r}'s rows, but {version!r} serves now"
        taken = set(meta.get("rollout_ids") or []) & ckpt.consumed_trajectory_ids(lake)
        if taken:
            return f"{len(taken)} of the saved progress's rows were trained on by another run meanwhile"
        return None

    @staticmethod
    def _read_pinned(lake: Lakehouse, versions: dict, ids: list[str]) -> list[dict]:
        con = lake.duckdb(["trajectories"], versions={"trajectories": versions.get("trajectories")})
        try:
            rows = con.execute("select * from trajectories where rollout_id in (select unnest($ids))", {"ids": ids}).fetch_arrow_table()
        finally:
            con.close()
        by_id = {r["rollout_id"]: r for r in rows.to_pylist()}
        missing = [i for i in ids if i not in by_id]
        if missing:
            raise ValueError(f"the saved progress's rows {missing[:3]} are gone from trajectories@{versions.get('trajectories')} "
                             f"(vacuumed?): delete $TENTALIS_HOME/training/idle_progress.pt to start over")
        return [by_id[i] for i in ids]

    def checkpointing(self) -> Checkpointing:
        self.cp = Checkpointing(store=self.store, every=self.every, should_yield=self.should_yield, poll_s=self.poll_s,
                                resume=self.resume, meta=self.meta)
        return self.cp

    def finished(self) -> None:
        self.store.clear()


def run_window(
    lake: Lakehouse, paths: Paths, policy: PolicySettings, config: GRPOConfig, *, promote: bool, activity_file: Path,
    idle_since_ns: int | None = None, hours: str = "", progress_every: int = 4, poll_s: float = 0.0, on_step=None,
    run_id: str = "", background: bool = False,
) -> StageResult:
    """One idle window: train (or resume) until done or until a request arrives, then record the window.

    ``idle_since_ns``: the activity file's value when the window was decided (the sensor passes it; None:
    read it now). Any change of it ends the window, as does leaving ``hours``. ``poll_s``: the least time
    between two looks at the activity file inside a pass (0: at every decoder layer, forward and
    backward; a look is one ``stat``, microseconds). ``background``: train in the idle CPU class
    (``training/cpu_priority.py``; one-way, for a process that exists to run the window)."""
    parse_hours(hours)  # a bad setting fails before anything trains
    started, t0 = now_utc(), time.monotonic()
    baseline = last_activity_ns(activity_file) if idle_since_ns is None else idle_since_ns
    idle_minutes = None if baseline is None else max(0.0, (time.time_ns() - baseline) / 6e10)
    seen: dict[str, Any] = {}

    def should_yield() -> bool:
        now = last_activity_ns(activity_file)
        if now != baseline:
            seen.setdefault("request_ns", now)  # the first touch after the window opened: the request's arrival
            seen.setdefault("reason", "a model request arrived at the gateway")
            return True
        if hours and not in_hours(now_utc(), hours):
            seen.setdefault("reason", f"the idle hours {hours} (UTC) ended")
            return True
        return False

    store = ProgressStore(progress_path(paths))
    window = WindowRun(store, progress_every, should_yield, poll_s=poll_s)
    row: dict[str, Any] = {"window_id": f"win-{started:%Y%m%dT%H%M%S}-{secrets.token_hex(3)}", "run_id": run_id or None,
                           "policy_version": serving_checkpoint(lake), "idle_minutes": idle_minutes, "started_at": started,
                           "micro_steps": 0, "steps": 0, "saves": 0}
    outcome, reason, error = "failed", "", None
    try:
        if should_yield():
            raise Preempted("a request arrived before the window started training")
        if background:
            run_in_background()
        trainable, window.refused = trainable_trajectories(lake, row["policy_version"], config.max_policy_lag)
        if not store.exists() and not trainable:
            outcome, reason = "nothing", "no fresh trajectories to train on"
        else:
            try:
                res = train_checkpoint(lake, paths, policy, config, promote=promote, on_step=on_step, window=window)
            except StaleProgress as exc:  # the rows or the config changed since the progress was saved: start over
                store.clear()
                window = WindowRun(store, progress_every, should_yield, poll_s=poll_s, discarded=str(exc))
                res = train_checkpoint(lake, paths, policy, config, promote=promote, on_step=on_step, window=window)
            outcome, reason = "finished", "trained to the end"
            row["checkpoint_id"] = res.metadata["checkpoint_id"]
    except Preempted as exc:
        outcome, reason = "preempted", f"{seen.get('reason', 'asked to yield')}: {exc}"
        if "request_ns" in seen:
            row["yield_seconds"] = max(0.0, time.time() - seen["request_ns"] / 1e9)
    except BaseException as exc:
        reason, error = f"{type(exc).__name__}: {exc}"[:500], exc
    cp = window.cp
    if cp is not None:
        row.update(micro_steps=cp.micro_steps, steps=cp.steps, saves=cp.saves, saved_at=_position(cp.saved or (
            window.resume.position if window.resume is not None else None)))
    row.update(outcome=outcome, reason=reason + (f" (a saved progress was dropped: {window.discarded})" if window.discarded else ""),
               resumed_from=_position(window.resume.position) if window.resume is not None else None,
               refused_policy_lag=window.refused, ended_at=now_utc(), trained_minutes=(time.monotonic() - t0) / 60)
    lake.append("training_windows", [row])
    if error is not None:
        raise error
    return StageResult(1, {k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()
                           if k not in ("started_at", "ended_at") and v is not None})
