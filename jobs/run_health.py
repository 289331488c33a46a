"""Dead runs and the `gpu` pool: a killed run must not hold its concurrency slot forever.

A run executed in-process (`dagster job execute`, `dagster asset materialize`, `materialize()`,
`tentalis run`) that is SIGKILLed never frees the pool slots its steps claimed, and stays STARTED: no
daemon launched it, so run monitoring never looks at it. Every later step of the `gpu` pool then waits
for a slot that nobody will free. Two repairs, installed by :func:`install` (called by the composition
root and the asset package, so every entry point that loads Tentalis' assets has them):

* **Dead runs are reaped** (:func:`reap_dead_runs`): a STARTED/STARTING run whose process (the pid in
  its "Executing steps in process" engine event) no longer exists on this machine, or is a zombie, or
  is a newer process that reused the pid, is marked FAILURE with the reason and its slots are freed.
  A step blocked on a pool slot checks this every :data:`REAP_EVERY_S` seconds, so the next run
  proceeds by itself; `tentalis reconcile`, `tentalis run` and `tentalis learn` also reap before they
  start. A pid means something on its own machine only: a run that claims a pool slot records its
  host (run tag ``tentalis/host``). On a local instance (SQLite, in memory) every run is this
  machine's; on a shared one (Postgres) only runs tagged with this host are judged and the others are
  left to the daemon's run monitoring, so a step on one machine never fails a live run on another.
* **A blocked step sleeps.** Dagster 1.13's ``InstanceConcurrencyContext.interval_to_next_pending_claim_check``
  returns ``min(0, ...)``, which is never positive, so the in-process executor polled the slot table
  in a tight loop (about 95% of a core). The patched interval is the time until the next claim check.
"""

from __future__ import annotations

import os
import socket
import time

from dagster import DagsterEventType, DagsterInstance, DagsterRunStatus, RunsFilter
from dagster._core.execution.plan.instance_concurrency_context import InstanceConcurrencyContext

REAP_EVERY_S = 5.0
HOST_TAG = "tentalis/host"
_LIVE_STATUSES = [DagsterRunStatus.STARTED, DagsterRunStatus.STARTING]


def run_pid(instance: DagsterInstance, run_id: str) -> int | None:
    """The pid of the process that executes the run's steps (from its first engine event that names one)."""
    conn = instance.get_records_for_run(run_id, of_type=DagsterEventType.ENGINE_EVENT, limit=50)
    for record in conn.records:
        event = record.event_log_entry.dagster_event
        metadata = getattr(event.event_specific_data, "metadata", None) if event else None
        if isinstance(metadata, dict) and "pid" in metadata:
            try:
                return int(str(metadata["pid"].value))
            except ValueError:
                return None
    return None


def _process_start_time(pid: int) -> float | None:
    """When ``pid`` started (seconds since the epoch), or None when it is gone or a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        with open("/proc/stat") as fh:
            boot = next(float(line.split()[1]) for line in fh if line.startswith("btime"))
    except (OSError, StopIteration, IndexError, ValueError):
        return None
    if fields[0] in ("Z", "X"):  # a zombie or dead task: its run is over
        return None
    return boot + int(fields[19]) / os.sysconf("SC_CLK_TCK")


def process_is_alive(pid: int, since: float) -> bool:
    """Whether ``pid`` runs now and is the process that existed at ``since`` (not a newer one with its pid)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    started = _process_start_time(pid)
    if started is None:
        return not os.path.exists("/proc/self/stat")  # without /proc, kill(0) is all there is to go by
    return started <= since + 2.0  # clock-tick rounding


def reap_dead_runs(instance: DagsterInstance) -> list[str]:
    """Mark every started run whose process died as failed and free its pool slots; return their ids."""
    reaped = []
    host, local = socket.gethostname(), _local_storage(instance)
    for record in instance.get_run_records(filters=RunsFilter(statuses=_LIVE_STATUSES)):
        run = record.dagster_run
        if not local and run.tags.get(HOST_TAG) != host:
            continue  # a shared instance: its pid may name a process on another machine
        pid = run_pid(instance, run.run_id)
        if pid is None:
            continue  # not executing steps yet (or launched elsewhere): nothing to judge by
        since = (record.start_time or record.create_timestamp.timestamp())
        if process_is_alive(pid, since):
            continue
        instance.report_run_failed(run, f"its process (pid {pid}) is gone: the run was killed; Tentalis freed its pool slots")
        instance.event_log_storage.free_concurrency_slots_for_run(run.run_id)
        reaped.append(run.run_id)
    return reaped


def _local_storage(instance: DagsterInstance) -> bool:
    """Whether the instance's runs live in this machine's storage (SQLite or in memory), not a shared database."""
    return type(instance.run_storage).__name__ in ("SqliteRunStorage", "InMemoryRunStorage")


_original_claim = InstanceConcurrencyContext.claim


def _claim_reaping_dead_holders(self, concurrency_key, step_key, step_priority=0):
    if not getattr(self, "_tentalis_host_tagged", False):
        self._tentalis_host_tagged = True  # before the claim: a slot holder always names its host
        self._instance.add_run_tags(self._run_id, {HOST_TAG: socket.gethostname()})
    claimed = _original_claim(self, concurrency_key, step_key, step_priority)
    if claimed:
        return True
    now = time.monotonic()
    if now - getattr(self, "_tentalis_last_reap", 0.0) < REAP_EVERY_S:
        return False
    self._tentalis_last_reap = now
    if reap_dead_runs(self._instance):
        self._pending_timeouts.pop(step_key, None)  # retry at once rather than after the backoff
        return _original_claim(self, concurrency_key, step_key, step_priority)
    return False


def _interval_to_next_pending_claim_check(self) -> float:
    if not self._pending_claims:
        return 0.0
    now = time.time()
    return max(0.0, min([ready_at - now for ready_at in self._pending_timeouts.values()], default=0.0))


def install() -> None:
    """Patch Dagster's concurrency context once per process (idempotent)."""
    InstanceConcurrencyContext.claim = _claim_reaping_dead_holders
    InstanceConcurrencyContext.interval_to_next_pending_claim_check = _interval_to_next_pending_claim_check
