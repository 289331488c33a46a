"""Where Tentalis keeps its state. Everything lives under one home folder (``$TENTALIS_HOME``), except
the Delta tables when ``$TENTALIS_LAKEHOUSE_URI`` puts them on object storage (``s3://bucket/prefix``)."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

DEFAULT_HOME = ".tentalis"
# Delta's default `delta.deletedFileRetentionDuration` (one week): files a commit removed stay on disk this
# long, so readers of an older snapshot and time travel keep working; vacuum never goes below it by default.
DEFAULT_VACUUM_RETENTION_HOURS = 168


# URI schemes of object stores that deltalake (delta-rs) opens; a plain path or file:// is the local disk.
OBJECT_STORE_SCHEMES = frozenset({"s3", "s3a", "gs", "az", "abfs", "abfss", "azure"})


def lakehouse_location(raw: str | os.PathLike[str]) -> Path | str:
    """Where the Delta tables live, from a setting such as ``$TENTALIS_LAKEHOUSE_URI``: an object-store URI
    (``s3://bucket/prefix``, kept as a string without its trailing slash), or a local folder (a path or
    ``file://`` URI, returned as an absolute :class:`Path`). Anything else is refused with the reason."""
    text = os.fspath(raw).strip()
    if not text:
        raise ValueError("the lakehouse location is empty")
    if "://" not in text:
        return Path(text).expanduser().resolve()
    parts = urlsplit(text)
    if parts.username or parts.password:
        raise ValueError("the lakehouse URI must not carry credentials: set them in the environment (AWS_ACCESS_KEY_ID, ...)")
    scheme = parts.scheme.lower()
    if scheme == "file":
        return Path(parts.path).expanduser().resolve()
    if scheme not in OBJECT_STORE_SCHEMES:
        raise ValueError(f"unsupported lakehouse URI scheme {scheme!r} in {text!r}: use a local path or one of "
                         f"{sorted(OBJECT_STORE_SCHEMES)}")
    if not parts.netloc:
        raise ValueError(f"lakehouse URI {text!r} names no bucket or container")
    return text.rstrip("/")


def lakehouse_uri_from_env() -> Path | str | None:
    """``$TENTALIS_LAKEHOUSE_URI`` as a lakehouse location (see :func:`lakehouse_location`), or None when unset."""
    raw = os.environ.get("TENTALIS_LAKEHOUSE_URI", "").strip()
    return lakehouse_location(raw) if raw else None


@dataclass(frozen=True)
class Paths:
    """All locations, derived from one home folder; the Delta tables may live elsewhere (``lakehouse_uri``)."""

    home: Path
    # Where the Delta tables live when not under ``home`` (an object-store URI or another local folder).
    lakehouse_uri: Path | str | None = None

    @classmethod
    def from_env(cls, home: str | os.PathLike[str] | None = None) -> Paths:
        """Home from ``home``, ``$TENTALIS_HOME`` or ``./.tentalis``; tables from ``$TENTALIS_LAKEHOUSE_URI`` when set."""
        raw = home or os.environ.get("TENTALIS_HOME") or DEFAULT_HOME
        return cls(Path(raw).expanduser().resolve(), lakehouse_uri_from_env())

    @property
    def lakehouse(self) -> Path | str:
        """The Delta tables' root: ``home/lakehouse`` (a :class:`Path`) unless ``lakehouse_uri`` is set,
        which may be an object-store URI (a ``str`` such as ``s3://bucket/prefix``)."""
        return self.lakehouse_uri if self.lakehouse_uri is not None else self.home / "lakehouse"

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
        """Create the local folders (an object-store lakehouse needs none: its tables appear on first write)."""
        local = [self.checkpoints, self.models, self.inbox, self.batches, self.dagster_home]
        if isinstance(self.lakehouse, Path):
            local.insert(0, self.lakehouse)
        for p in local:
            p.mkdir(parents=True, exist_ok=True)
        return self


def data_dir() -> Path | None:
    """Benchmark data folder (GSM8K, MATH-500, ProcessBench): ``$TENTALIS_DATA_DIR`` when set (even if it
    does not exist: every benchmark is then missing), else ``$TENTALIS_HOME/data`` when that folder exists
    (where ``tentalis data fetch`` puts the files by default), else None (no benchmark data installed)."""
    raw = os.environ.get("TENTALIS_DATA_DIR", "").strip()
    if raw:
        return Path(raw).expanduser().resolve()
    fetched = data_fetch_dir()
    return fetched if fetched.is_dir() else None


def data_fetch_dir() -> Path:
    """Where ``tentalis data fetch`` writes by default: ``$TENTALIS_DATA_DIR``, else ``$TENTALIS_HOME/data``."""
    raw = os.environ.get("TENTALIS_DATA_DIR", "").strip()
    return Path(raw).expanduser().resolve() if raw else Paths.from_env().home / "data"


def vacuum_retention_hours() -> int:
    """How long vacuum keeps removed files: ``$TENTALIS_VACUUM_RETENTION_HOURS``, default 168 (one week)."""
    return env_hours("TENTALIS_VACUUM_RETENTION_HOURS", DEFAULT_VACUUM_RETENTION_HOURS, whole=True)


def inbox_settle_seconds() -> float:
    """How long an inbox file must stay unchanged before it becomes a batch: ``$TENTALIS_INBOX_SETTLE_SECONDS``, default 10."""
    return env_seconds("TENTALIS_INBOX_SETTLE_SECONDS", 10.0)


def session_settle_seconds() -> float:
    """How long a reviewed session must have had no new turn before ``fresh_sessions`` cuts it into a batch
    (a session still in use is cut later): ``$TENTALIS_SESSION_SETTLE_SECONDS``, default 60."""
    return env_seconds("TENTALIS_SESSION_SETTLE_SECONDS", 60.0)


def session_review_wait_seconds() -> float:
    """How long a session without any review must have had no new turn before ``fresh_sessions`` cuts it
    anyway, for the judge to review (only when a judge is configured: ``review.manager = llm``). Managers
    get this long to review first, and their reviews always win over the judge's:
    ``$TENTALIS_SESSION_REVIEW_WAIT_SECONDS``, default 3600 (one hour)."""
    return env_seconds("TENTALIS_SESSION_REVIEW_WAIT_SECONDS", 3600.0)


def env_seconds(name: str, default: float) -> float:
    """A duration in seconds from the environment variable ``name``; ``default`` when it is unset or blank.

    The rules of every duration Tentalis reads from the environment (:func:`env_hours` too): a number
    (``10``, ``0.5``, ``1e3``), 0 or more; ``inf`` is accepted and means never. A value that is not a
    number, NaN or negative raises ValueError naming the variable and the value, e.g.
    ``TENTALIS_INBOX_SETTLE_SECONDS='ten' is not a number of seconds``."""
    return _env_duration(name, default, "seconds", whole=False)


def env_hours(name: str, default: float, *, whole: bool = False) -> float:
    """A duration in hours from the environment variable ``name``, by :func:`env_seconds`'s rules;
    ``whole``: a whole number of hours (an int)."""
    return _env_duration(name, default, "hours", whole=whole)


def _env_duration(name: str, default: float, unit: str, *, whole: bool) -> float:
    raw = os.environ.get(name, "")
    if not raw.strip():
        return default
    kind = f"{'a whole' if whole else 'a'} number of {unit}"
    try:
        value = int(raw) if whole else float(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not {kind}") from None
    if math.isnan(value):
        raise ValueError(f"{name}={raw!r} is not {kind}")
    if value < 0:
        raise ValueError(f"{name}={raw!r} must be 0 or more")
    return value
