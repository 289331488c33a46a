"""The write-ahead log: what makes an acknowledged turn durable before it is in Delta.

A turn is appended as one JSON line to the active segment (``wal-<seq>.jsonl`` under
``$TENTALIS_HOME/gateway/wal/``) and fsynced before the client gets its response; a new segment's
directory entry is fsynced before its first record is acknowledged. The ``Flusher`` thread seals the
active segment every ``interval`` seconds (or sooner when it holds ``max_records``), lands every
sealed segment's records in Delta with one merge per table (by turn id: landing a record twice
changes nothing), and deletes the segments only after that commit. On start every segment left
behind (a SIGKILL, a power loss) is sealed and landed again before the gateway serves: an
acknowledged turn lands exactly once. A torn last line (a write the crash interrupted, never
acknowledged) is skipped.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tentalis_pipelines.files import fsync_dir

log = logging.getLogger(__name__)


class WriteAheadLog:
    """Append-only JSONL segments; ``append`` returns once the records are on disk."""

    def __init__(self, folder: Path):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        existing = self.segments()
        self._next_seq = (int(existing[-1].stem.split("-")[1]) + 1) if existing else 1
        self._active: Any = None  # the open file of the active segment
        self._active_path: Path | None = None
        self._active_records = 0
        self.appended = 0

    def segments(self) -> list[Path]:
        """Every segment on disk, oldest first (the active one last, if any)."""
        return sorted(self.folder.glob("wal-*.jsonl"))

    def append(self, records: list[dict[str, Any]]) -> None:
        """Write ``records`` to the active segment and fsync it (one write, one fsync per call)."""
        data = "".join(json.dumps(r, separators=(",", ":"), default=str) + "\n" for r in records).encode()
        with self._lock:
            if self._active is None:
                self._active_path = self.folder / f"wal-{self._next_seq:012d}.jsonl"
                self._next_seq += 1
                self._active = open(self._active_path, "ab", buffering=0)  # noqa: SIM115 - open across appends until sealed
                fsync_dir(self.folder)  # the new file's name is durable before its first record is acknowledged
            fd = self._active.fileno()
            start = os.lseek(fd, 0, os.SEEK_END)
            try:
                view = memoryview(data)
                while view:  # unbuffered: a failed write leaves nothing in a buffer to be written later
                    view = view[os.write(fd, view):]
                os.fsync(fd)
            except OSError:
                self._undo(fd, start)
                raise
            self._active_records += len(records)
            self.appended += len(records)

    def _undo(self, fd: int, start: int) -> None:
        """Take back a failed append (ENOSPC, EIO: never acknowledged). The segment is cut back to where the
        append began, so no part of the record can land later; if even that fails, the segment is sealed,
        so the torn bytes stay its last line, which ``read`` skips, and later appends go to a new segment."""
        try:
            os.ftruncate(fd, start)
            os.fsync(fd)
        except OSError:
            log.exception("could not cut a failed append back out of %s; sealing it", self._active_path)
            self._active.close()
            self._active, self._active_path, self._active_records = None, None, 0

    @property
    def active_records(self) -> int:
        return self._active_records

    def seal(self) -> None:
        """Close the active segment: later appends go to a new one."""
        with self._lock:
            if self._active is not None:
                self._active.close()
                self._active, self._active_path, self._active_records = None, None, 0

    def sealed(self) -> list[Path]:
        # The listing and the active path are read under one lock: listed outside it, a segment that an
        # append opened in between would count as sealed, and the flusher would land it half-written and
        # then delete it while later acknowledged records were still being appended to it.
        with self._lock:
            active = self._active_path
            return [p for p in self.segments() if p != active]

    @staticmethod
    def read(path: Path) -> list[dict[str, Any]]:
        """A segment's records; a torn (unparsable) last line is skipped: it was never acknowledged."""
        records = []
        lines = path.read_bytes().split(b"\n")
        for i, line in enumerate(lines):
            if not line.strip():
                continue
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                if i < len(lines) - 1 and any(x.strip() for x in lines[i + 1:]):
                    raise RuntimeError(f"WAL segment {path} is corrupt at line {i + 1} (not its last line)") from None
                log.warning("skipping a torn last line in %s (an unacknowledged write cut by a crash)", path)
        return records

    def remove(self, paths: list[Path]) -> None:
        for p in paths:
            p.unlink(missing_ok=True)
        fsync_dir(self.folder)

    def close(self) -> None:
        self.seal()


class Flusher:
    """Lands sealed WAL segments in Delta in micro-batches, exactly once, from a background thread."""

    def __init__(self, wal: WriteAheadLog, land: Callable[[list[dict[str, Any]]], None], *, interval: float = 0.5,
                 max_records: int = 2000):
        self.wal, self.land = wal, land
        self.interval, self.max_records = interval, max_records
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._flush_lock = threading.Lock()
        self.flushed = 0  # records landed since start
        self.commits = 0
        self.last_flush_seconds: float | None = None
        self.last_error: str | None = None
        self.replayed = 0

    def flush(self) -> int:
        """Seal the active segment and land every sealed one. Returns the records landed."""
        with self._flush_lock:
            self.wal.seal()
            paths = self.wal.sealed()
            if not paths:
                return 0
            records = [r for p in paths for r in self.wal.read(p)]
            t0 = time.perf_counter()
            if records:
                self.land(records)  # merges by key: a crash after this and before remove() lands them again, harmlessly
            self.wal.remove(paths)
            self.last_flush_seconds = time.perf_counter() - t0
            self.flushed += len(records)
            self.commits += 1
            return len(records)

    def replay(self) -> int:
        """Land every segment a previous process left (run before serving). Returns the records landed."""
        n = self.flush()
        self.flushed = 0
        self.replayed = n
        return n

    def pending(self) -> int:
        """Records appended but not yet landed (acknowledged, durable in the WAL only)."""
        return self.wal.appended - self.flushed if self.wal.appended >= self.flushed else 0

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="tentalis-wal-flusher", daemon=True)
        self._thread.start()

    def poke(self) -> None:
        if self.wal.active_records >= self.max_records:
            self._wake.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.interval)
            self._wake.clear()
            try:
                self.flush()
                self.last_error = None
            except Exception as exc:  # noqa: BLE001 - the records stay in the WAL; retried next round
                self.last_error = str(exc)
                log.exception("WAL flush failed; retrying")
                self._stop.wait(min(5.0, self.interval * 4))

    def stop(self) -> None:
        """Stop the thread and land what is left."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        self.flush()
