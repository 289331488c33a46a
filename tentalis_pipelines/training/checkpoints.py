"""The checkpoint store: LoRA adapters written atomically, lineage rows in ``checkpoints``, training
claims in ``training_claims``, and ``reconcile`` for whatever a crash left behind.

Writing a checkpoint, in order (each step is one crash window; ``reconcile`` closes every one):

1. ``claim_training``: a ``claimed`` row in ``training_claims`` for the serving policy's fresh
   trajectories, with the holder (host, pid and its start time, thread), the checkpoint id the run will
   write and whether it intends to promote. A second trainer on the same policy fails fast, naming
   the holder. The claim is checked and appended under an exclusive lock file, so two trainers cannot
   both get it.
2. ``save_adapter``: the adapter (and whatever ``extra`` writes, e.g. optimizer state) goes into a
   hidden ``.tmp-<id>-<pid>@<host>`` folder, every file and folder is fsynced, a ``COMPLETE`` marker
   lists the files, one ``os.replace`` puts it in place and the parent folder is fsynced.
3. ``record_checkpoint``: the row in ``checkpoints`` (its ``trajectory_ids`` now count as consumed).
4. ``serving.promote`` when the run promotes (``trainer.promotion = "always"``).
5. ``finish_claim``: a ``done`` row.

``reconcile`` (run at the start of every training run and by ``tentalis init`` / ``tentalis
reconcile``) settles every claim whose holder is gone:

* no checkpoint row: the adapter folder, if the rename happened, is removed (an adapter without a row
  was never served, benchmarked or counted; its lineage died with the process) and the claim is
  abandoned, so its trajectories stay fresh and the next run trains on them;
* a row, and the run meant to promote: the promotion is finished (``reconcile`` row in ``serving``)
  when the serving policy is still the one the run trained from; if someone moved serving meanwhile,
  the promotion is abandoned instead and the checkpoint's trajectories count as fresh again
  (``CONSUMED_SQL`` skips checkpoints of abandoned claims);
* a row and no promotion intended (the gate decides): the claim is done.

It also removes temporary folders whose writer is dead, removes orphan adapter folders (no row, no
live claim, older than ``ORPHAN_GRACE_S``) and sets ``checkpoints.promoted`` for checkpoints the
serving log shows were promoted (a crash between the pointer move and that flag).

Locks are ``fcntl`` lock files under ``<lakehouse>/.locks``. An object-store lakehouse has no shared
file system for them: its lock files live under ``$TENTALIS_HOME/locks`` and exclude this machine's
processes only, so across machines a single trainer at a time comes from the shared Dagster
instance's ``gpu`` pool (one slot), and a warning says so.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import json
import logging
import os
import re
import secrets
import shutil
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from tentalis_pipelines.files import fsync_dir, fsync_tree
from tentalis_pipelines.lakehouse import Lakehouse, dumps, now_utc
from tentalis_pipelines.settings import env_hours

log = logging.getLogger(__name__)

MARKER = "COMPLETE"
# A claim from another host cannot be checked for liveness; after this many hours it counts as stale.
CLAIM_TTL_HOURS = env_hours("TENTALIS_CLAIM_TTL_HOURS", 24.0)
# An adapter folder with no row and no claim is only removed once it is this old (a writer that does
# not claim, e.g. a script calling save_adapter and record_checkpoint, may be between the two).
ORPHAN_GRACE_S = 600.0
LOCK_TIMEOUT_S = 120.0

# The trajectory ids that checkpoints have consumed: every checkpoint's, except those of checkpoints
# whose training claim was abandoned (their promotion never happened, so their data is fresh again).
CONSUMED_SQL = (
    "select unnest(c.trajectory_ids) from checkpoints c where c.checkpoint_id not in "
    "(select checkpoint_id from training_claims where event = 'abandoned' and checkpoint_id is not null)"
)

_TMP = re.compile(r"^\.tmp-(?P<id>.+)-(?P<pid>\d+)(?:@(?P<host>[^/]+))?$")


class CheckpointError(RuntimeError):
    pass


class TrainingClaimError(RuntimeError):
    """Another run holds the claim on these fresh trajectories, or they were consumed meanwhile."""


def new_checkpoint_id() -> str:
    return f"ckpt-{datetime.now(timezone.utc):%Y%m%dT%H%M%S}-{secrets.token_hex(3)}"


# --------------------------------------------------------------------------- locks and liveness
@contextlib.contextmanager
def lakehouse_lock(lake: Lakehouse, name: str, timeout: float = LOCK_TIMEOUT_S) -> Iterator[None]:
    """An exclusive ``fcntl`` lock on ``<lakehouse>/.locks/<name>.lock`` (released by the kernel when
    the holder dies).

    An object store has no file locks: the lock file is then ``$TENTALIS_HOME/locks/<root hash>/<name>.lock``
    on this machine, which excludes the processes of this machine only. Across machines, training and
    serving changes must be serialised by the shared Dagster instance's ``gpu`` pool (limit 1, on
    Postgres), which is what a multi-machine deployment uses; a warning says so once per process."""
    folder = object_store_lock_dir(lake) if lake.is_object_store else Path(lake.root) / ".locks"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.lock"
    with open(path, "a+") as fh:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"could not take the lock {path} within {timeout:.0f} s") from None
                time.sleep(0.05)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def object_store_lock_dir(lake: Lakehouse) -> Path:
    """The local folder holding the lock files of an object-store lakehouse (see ``lakehouse_lock``)."""
    from tentalis_pipelines.settings import Paths

    if lake.root not in _warned_lock_scope:
        _warned_lock_scope.add(lake.root)
        log.warning("lakehouse %s is on an object store: training and serving locks hold on this machine only; "
                    "run training through the shared Dagster instance's gpu pool (limit 1) so that no two "
                    "machines train or promote at once", lake.root)
    digest = hashlib.sha256(lake.root.encode()).hexdigest()[:16]
    return Paths.from_env().home / "locks" / digest


_warned_lock_scope: set[str] = set()


def _proc_stat(pid: int) -> tuple[str, int] | None:
    """(state, start time in clock ticks) of a process from /proc, or None where unreadable."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rfind(")") + 2:].split()
    return fields[0], int(fields[19])


def pid_alive(pid: int, start: int | None = None) -> bool:
    """Whether process ``pid`` on this host runs (not a zombie; the same process when ``start`` is known)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    stat = _proc_stat(pid)
    if stat is None:
        return True
    state, started = stat
    return state not in ("Z", "X") and (start is None or started == start)


# --------------------------------------------------------------------------- adapters
def _stale_temp(path: Path) -> bool:
    """A ``.tmp-*`` folder whose writer is gone: a dead pid on this host, or older than the claim TTL
    on another host. Folders of live writers (another trainer saving right now) are left alone."""
    m = _TMP.match(path.name)
    if not m:
        return False
    host = m.group("host")
    if host and host != socket.gethostname():
        return time.time() - path.stat().st_mtime > CLAIM_TTL_HOURS * 3600
    return not pid_alive(int(m.group("pid")))


def remove_stale_temps(root: Path) -> list[str]:
    """Remove the temporary folders in ``root`` whose writer is dead; returns their names."""
    removed = []
    for tmp in root.glob(".tmp-*"):
        if tmp.is_dir() and _stale_temp(tmp):
            shutil.rmtree(tmp, ignore_errors=True)
            removed.append(tmp.name)
    return removed


def save_adapter(model, root: Path, checkpoint_id: str, *, extra: Callable[[Path], None] | None = None) -> Path:
    """Save a peft model's adapter atomically under ``root/checkpoint_id``.

    ``extra`` is called with the temporary folder after ``model.save_pretrained`` and before the
    ``COMPLETE`` marker, so what it writes (optimizer state) is listed in the marker and lands with
    the adapter in the same rename. Temporary folders of dead writers are removed first; a failure
    here removes this writer's own temporary folder.
    """
    root.mkdir(parents=True, exist_ok=True)
    remove_stale_temps(root)
    final = root / checkpoint_id
    if final.exists():
        raise CheckpointError(f"checkpoint {checkpoint_id} already exists at {final}")
    tmp = root / f".tmp-{checkpoint_id}-{os.getpid()}@{socket.gethostname()}"
    try:
        model.save_pretrained(str(tmp), safe_serialization=True)
        if extra is not None:
            extra(tmp)
        files = sorted(str(p.relative_to(tmp)) for p in tmp.rglob("*") if p.is_file())
        (tmp / MARKER).write_text(json.dumps({"files": files}))
        fsync_tree(tmp)
        os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    fsync_dir(root)  # the rename itself survives a power loss only once the parent folder is synced
    return final


def verify_adapter(path: str | Path) -> Path:
    """Raise unless ``path`` is a complete adapter folder."""
    path = Path(path)
    marker = path / MARKER
    if not marker.exists():
        raise CheckpointError(f"{path} is not a complete checkpoint (no {MARKER} marker)")
    missing = [f for f in json.loads(marker.read_text())["files"] if not (path / f).exists()]
    if missing:
        raise CheckpointError(f"checkpoint {path} is missing files {missing}")
    return path


def record_checkpoint(lake: Lakehouse, row: dict[str, Any]) -> None:
    verify_adapter(row["adapter_uri"])
    row = {"created_at": now_utc(), **row}
    for key in ("config", "metrics"):
        if not isinstance(row[key], str):
            row[key] = dumps(row[key])
    lake.append("checkpoints", [row])


def checkpoint_row(lake: Lakehouse, checkpoint_id: str, *, table: str = "checkpoints") -> dict[str, Any] | None:
    """The row of ``checkpoint_id`` in ``table`` (``checkpoints``, or ``manager_checkpoints``), or None."""
    if table != "checkpoints" and not lake.exists(table):
        return None
    return next((r for r in lake.read(table).to_pylist() if r["checkpoint_id"] == checkpoint_id), None)


# --------------------------------------------------------------------------- training claims
@dataclass
class TrainingClaim:
    """One run's claim on the fresh trajectories of ``policy_version``; it will write ``checkpoint_id``."""

    claim_id: str
    checkpoint_id: str
    policy_version: str
    promote: bool
    trajectory_count: int
    host: str
    pid: int
    pid_start: int | None
    thread: int
    run: str
    created_at: datetime
    finished: bool = False

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> TrainingClaim:
        return cls(**{k: row[k] for k in ("claim_id", "checkpoint_id", "policy_version", "promote", "trajectory_count", "host", "pid",
                                          "pid_start", "thread", "run", "created_at")})

    def holder(self) -> str:
        return (f"pid {self.pid} on {self.host} ({self.run}), claim {self.claim_id} for checkpoint {self.checkpoint_id}, "
                f"since {self.created_at:%Y-%m-%d %H:%M:%S} UTC")

    def alive(self) -> bool:
        """Whether the holder may still be training: its thread (same process), process (same host) or,
        on another host, whether the claim is younger than ``CLAIM_TTL_HOURS``."""
        if self.host != socket.gethostname():
            return (now_utc() - self.created_at).total_seconds() < CLAIM_TTL_HOURS * 3600
        if self.pid == os.getpid():
            mine = _proc_stat(self.pid)
            if self.pid_start is not None and mine is not None and mine[1] != self.pid_start:
                return False  # an earlier process that had this pid
            # This process: a claim left by this very thread is from an earlier call that ended.
            return self.thread != threading.get_ident() and any(t.ident == self.thread for t in threading.enumerate())
        return pid_alive(self.pid, self.pid_start)


_claims_local = threading.local()


def claims(lake: Lakehouse) -> list[tuple[TrainingClaim, str, str]]:
    """Every claim with its last event ('claimed', 'done' or 'abandoned') and that event's reason."""
    rows = sorted(lake.read("training_claims").to_pylist(), key=lambda r: r["created_at"])
    state: dict[str, tuple[TrainingClaim, str, str]] = {}
    for r in rows:
        if r["event"] == "claimed":
            state[r["claim_id"]] = (TrainingClaim.from_row(r), "claimed", r["reason"] or "")
        elif r["claim_id"] in state:
            state[r["claim_id"]] = (state[r["claim_id"]][0], r["event"], r["reason"] or "")
    return list(state.values())


def active_claims(lake: Lakehouse) -> list[TrainingClaim]:
    """Claims with neither a 'done' nor an 'abandoned' event (live or stale)."""
    return [c for c, event, _ in claims(lake) if event == "claimed"]


def _claim_event(lake: Lakehouse, claim: TrainingClaim, event: str, reason: str) -> None:
    row = {**claim.__dict__, "event": event, "reason": reason, "created_at": now_utc()}
    row.pop("finished")
    lake.append("training_claims", [row])
    claim.finished = event != "claimed"


def consumed_trajectory_ids(lake: Lakehouse) -> set[str]:
    con = lake.duckdb(["checkpoints", "training_claims"])
    try:
        return {r[0] for r in con.execute(CONSUMED_SQL).fetchall()}
    finally:
        con.close()


def claim_training(
    lake: Lakehouse, paths, policy_version: str, trajectory_ids, *, promote: bool, run: str | None = None
) -> TrainingClaim:
    """Claim the fresh trajectories of ``policy_version`` for this run, or fail fast.

    Under the training lock: a stale claim on the same policy is settled first (see ``reconcile``); a
    live one raises ``TrainingClaimError`` naming its holder (a second trainer never trains the same
    set, it fails); ids consumed since the caller read them (a run finished in between) raise too.
    """
    ids = set(trajectory_ids)
    with lakehouse_lock(lake, "training"):
        for other in active_claims(lake):
            if other.policy_version != policy_version:
                continue
            if other.alive():
                raise TrainingClaimError(
                    f"the fresh trajectories of policy {policy_version!r} are being trained on by {other.holder()}: "
                    "this run stops. Wait for that run; if its process is gone, `tentalis reconcile` settles the claim")
            _settle(lake, paths, other)
        taken = ids & consumed_trajectory_ids(lake)
        if taken:
            raise TrainingClaimError(f"{len(taken)} of the {len(ids)} fresh trajectories of {policy_version!r} were consumed "
                                     "by a checkpoint recorded while this run started: run it again")
        stat = _proc_stat(os.getpid())
        claim = TrainingClaim(
            claim_id=f"claim-{secrets.token_hex(6)}", checkpoint_id=new_checkpoint_id(), policy_version=policy_version, promote=promote,
            trajectory_count=len(ids), host=socket.gethostname(), pid=os.getpid(), pid_start=stat[1] if stat else None,
            thread=threading.get_ident(), run=run or os.environ.get("TENTALIS_RUN_ID") or Path(sys.argv[0]).name or "python",
            created_at=now_utc(),
        )
        _claim_event(lake, claim, "claimed", f"{len(ids)} fresh trajectories of {policy_version}")
    held = getattr(_claims_local, "claims", None)
    if held is not None:
        held.append((lake, claim))
    return claim


def finish_claim(lake: Lakehouse, claim: TrainingClaim, reason: str = "checkpoint recorded") -> None:
    """The run is done: its checkpoint row (and promotion, if intended) are in."""
    _claim_event(lake, claim, "done", reason)


def abandon_claim(lake: Lakehouse, claim: TrainingClaim, reason: str) -> None:
    """Give the claim up: its trajectories are fresh again (also when its checkpoint row exists)."""
    _claim_event(lake, claim, "abandoned", reason)


def abandons_claims_on_error(fn):
    """Decorator for a training entry point: claims it takes and has not finished when it raises are
    abandoned (with the error as the reason), so a failed run never holds trajectories."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        outer = getattr(_claims_local, "claims", None)
        _claims_local.claims = taken = []
        try:
            return fn(*args, **kwargs)
        except BaseException as exc:
            for lake, claim in taken:
                if not claim.finished:
                    with contextlib.suppress(Exception):  # reconcile settles it later; the original error matters
                        abandon_claim(lake, claim, f"the run failed: {type(exc).__name__}: {exc}"[:500])
            raise
        finally:
            _claims_local.claims = outer

    return wrapper


# --------------------------------------------------------------------------- reconcile
def _settle(lake: Lakehouse, paths, claim: TrainingClaim) -> str:
    """Finish or abandon one claim whose holder is gone (see the module docstring). Returns the outcome."""
    from tentalis_pipelines.training import serving

    who = f"pid {claim.pid} on {claim.host}"
    row = checkpoint_row(lake, claim.checkpoint_id)
    if row is None:
        folder = paths.checkpoints / claim.checkpoint_id
        note = ""
        if folder.exists():
            shutil.rmtree(folder, ignore_errors=True)
            note = f"; its unrecorded adapter folder {folder} was removed"
        abandon_claim(lake, claim, f"the trainer ({who}) died before recording {claim.checkpoint_id}{note}; "
                                   f"its {claim.trajectory_count} trajectories stay fresh")
        return "abandoned"
    if not claim.promote:
        finish_claim(lake, claim, "reconciled: checkpoint recorded; the promotion gate decides")
        return "done"
    current = serving.serving_checkpoint(lake)
    if current == claim.checkpoint_id:
        finish_claim(lake, claim, "reconciled: checkpoint recorded and promoted")
        return "done"
    try:
        serving.promote(lake, claim.checkpoint_id, actor="reconcile", action="reconcile", expect_from=claim.policy_version,
                        reason=f"finishing the promotion of training claim {claim.claim_id}: the trainer ({who}) died after recording it")
    except (serving.ServingError, CheckpointError) as exc:
        abandon_claim(lake, claim, f"the trainer ({who}) died before promoting {claim.checkpoint_id} and it cannot be promoted now "
                                   f"({exc}); its {claim.trajectory_count} trajectories are fresh again")
        return "abandoned"
    finish_claim(lake, claim, "reconciled: promotion finished")
    return "done"


def reconcile(lake: Lakehouse, paths) -> dict[str, list[str]]:
    """Bring the checkpoint store, ``training_claims`` and ``serving`` back to a consistent state after
    crashes (see the module docstring). Safe to run at any time and any number of times; live runs
    are left alone. Returns what it did."""
    from tentalis_pipelines.training import serving

    report: dict[str, list[str]] = {"temp_removed": [], "orphans_removed": [], "claims_done": [], "claims_abandoned": [],
                                    "promoted_flag_set": []}
    with lakehouse_lock(lake, "training"):
        if paths.checkpoints.exists():
            report["temp_removed"] = remove_stale_temps(paths.checkpoints)
        live = set()
        for claim in active_claims(lake):
            if claim.alive():
                live.add(claim.checkpoint_id)
                continue
            outcome = _settle(lake, paths, claim)
            report["claims_done" if outcome == "done" else "claims_abandoned"].append(claim.claim_id)
        rows = lake.read("checkpoints", columns=["checkpoint_id", "adapter_uri", "promoted"]).to_pylist()
        known = {r["checkpoint_id"] for r in rows} | {Path(r["adapter_uri"]).name for r in rows}
        if paths.checkpoints.exists():
            for folder in paths.checkpoints.iterdir():
                if folder.name.startswith(".") or not folder.is_dir() or folder.name in known or folder.name in live:
                    continue
                looks_like_adapter = (folder / MARKER).exists() or (folder / "adapter_config.json").exists()
                if looks_like_adapter and time.time() - folder.stat().st_mtime > ORPHAN_GRACE_S:
                    shutil.rmtree(folder, ignore_errors=True)
                    report["orphans_removed"].append(folder.name)
        served = {r["to_checkpoint"] for r in serving.serving_history(lake)}
        for r in rows:
            if r["checkpoint_id"] in served and not r["promoted"]:
                serving.mark_promoted(lake, r["checkpoint_id"])
                report["promoted_flag_set"].append(r["checkpoint_id"])
    return report
