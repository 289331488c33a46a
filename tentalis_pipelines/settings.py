"""Where Tentalis keeps its state. Everything lives under one home folder (``$TENTALIS_HOME``)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

DEFAULT_HOME = ".tentalis"
# Delta's default `delta.deletedFileRetentionDuration` (one week): files a commit removed stay on disk this
# long, so readers of an older snapshot and time travel keep working; vacuum never goes below it by default.
DEFAULT_VACUUM_RETENTION_HOURS = 168


@dataclass(frozen=True)
class Paths:
    """All on-disk locations, derived from one home folder."""

    home: Path

    @classmethod
    def from_env(cls, home: str | os.PathLike[str] | None = None) -> Paths:
        raw = home or os.environ.get("TENTALIS_HOME") or DEFAULT_HOME
        return cls(Path(raw).expanduser().resolve())

    @property
    def lakehouse(self) -> Path:
        return self.home / "lakehouse"

    @property
    def checkpoints(self) -> Path:
        return self.home / "checkpoints"

    @property
    def models(self) -> Path:
        return self.home / "models"

    @property
    def inbox(self) -> Path:
        return self.home / "inbox"

    @property
    def batches(self) -> Path:
        """Immutable snapshots of every registered task batch (so a re-run sees the same input)."""
        return self.home / "batches"

    @property
    def dagster_home(self) -> Path:
        return self.home / "dagster"

    def ensure(self) -> Paths:
        for p in (self.lakehouse, self.checkpoints, self.models, self.inbox, self.batches, self.dagster_home):
            p.mkdir(parents=True, exist_ok=True)
        return self


def data_dir() -> Path | None:
    """Benchmark data folder (GSM8K, MATH-500, ProcessBench) from ``$TENTALIS_DATA_DIR``, if set."""
    raw = os.environ.get("TENTALIS_DATA_DIR")
    return Path(raw).expanduser().resolve() if raw else None


def vacuum_retention_hours() -> int:
    """How long vacuum keeps removed files: ``$TENTALIS_VACUUM_RETENTION_HOURS``, default 168 (one week)."""
    raw = os.environ.get("TENTALIS_VACUUM_RETENTION_HOURS")
    if not raw:
        return DEFAULT_VACUUM_RETENTION_HOURS
    try:
        hours = int(raw)
    except ValueError:
        raise ValueError(f"TENTALIS_VACUUM_RETENTION_HOURS must be a whole number of hours, not {raw!r}") from None
    if hours < 0:
        raise ValueError(f"TENTALIS_VACUUM_RETENTION_HOURS must not be negative, not {hours}")
    return hours


def inbox_settle_seconds() -> float:
    """How long an inbox file must stay unchanged before it becomes a batch: ``$TENTALIS_INBOX_SETTLE_SECONDS``, default 10."""
    raw = os.environ.get("TENTALIS_INBOX_SETTLE_SECONDS")
    if raw is None:
        return 10.0
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"TENTALIS_INBOX_SETTLE_SECONDS={raw!r} is not a number of seconds") from None
    if value < 0:
        raise ValueError(f"TENTALIS_INBOX_SETTLE_SECONDS={raw!r} must be 0 or more")
    return value
