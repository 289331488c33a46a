"""The serving pointer: which checkpoint the next rollouts, benchmarks of 'promoted' and the gate's
incumbent use.

Every change of the serving policy is one row of the append-only ``serving`` table (seq, from, to,
action, actor, reason, created_at). The policy that serves is the row with the highest ``seq``, or the
base model while the table is empty. Promoting an older checkpoint (a rollback, a late gate result)
therefore takes effect like any other promotion, and the table is the audit trail of who changed
what serves, when and why.

A move reads the highest seq and appends seq + 1 under an exclusive ``fcntl`` lock file under the
lakehouse root, so concurrent promoters are serialised and never write the same seq. An object-store
lakehouse (``s3://...``) has no such lock: a Delta append never conflicts with another append, so there
promotions need a single writer (one Dagster run at a time in the ``gpu`` pool, one operator).

Every move is also a row of the ``audit`` table (``tentalis_pipelines.audit``), and a checkpoint that a
retraction marked as trained on retracted data is refused.

``checkpoints.promoted`` keeps meaning "has been promoted at some time" (set after the pointer moves;
``reconcile`` sets it if a crash came in between), but nothing decides what serves from it.
"""

from __future__ import annotations

from typing import Any

from tentalis_pipelines import audit
from tentalis_pipelines.lakehouse import Lakehouse, now_utc
from tentalis_pipelines.training.checkpoints import (
    CheckpointError,
    checkpoint_row,
    lakehouse_lock,
    verify_adapter,
)

BASE = "base"
ACTIONS = ("promote", "rollback", "gate", "reconcile", "migrate", "retract")


class ServingError(RuntimeError):
    """The serving policy cannot be used or moved as asked."""


class ServingConflict(ServingError):
    """The serving policy is not the one the caller expected (someone moved it meanwhile)."""


def serving_history(lake: Lakehouse) -> list[dict[str, Any]]:
    """Every change of the serving policy, oldest first (by ``seq``)."""
    if not lake.exists("serving"):
        _migrate_legacy(lake)
    return _read(lake)


def _read(lake: Lakehouse) -> list[dict[str, Any]]:
    return sorted(lake.read("serving").to_pylist(), key=lambda r: (r["seq"], r["created_at"]))


def current_row(lake: Lakehouse) -> dict[str, Any] | None:
    """The serving table's row with the highest seq, or None (the base model serves)."""
    history = serving_history(lake)
    return history[-1] if history else None


def serving_checkpoint(lake: Lakehouse) -> str:
    """The id of the serving checkpoint ('base' for the base model), without checking its files."""
    row = current_row(lake)
    return BASE if row is None else row["to_checkpoint"]


def _adapter(lake: Lakehouse, checkpoint_id: str) -> str:
    row = checkpoint_row(lake, checkpoint_id)
    if row is None:
        raise ServingError(f"checkpoint {checkpoint_id!r} has no row in `checkpoints`")
    return verify_adapter(row["adapter_uri"]).as_posix()


def serving_policy(lake: Lakehouse) -> tuple[str, str | None]:
    """(checkpoint_id, adapter folder) of the serving policy, or ('base', None).

    A serving checkpoint whose adapter is missing or incomplete raises ``ServingError``: it is never
    replaced silently by another adapter."""
    checkpoint_id = serving_checkpoint(lake)
    if checkpoint_id == BASE:
        return BASE, None
    try:
        return checkpoint_id, _adapter(lake, checkpoint_id)
    except (CheckpointError, ServingError) as exc:
        raise ServingError(
            f"the serving checkpoint {checkpoint_id} cannot be loaded: {exc}. Nothing else is served in its place: "
            f"go back with `tentalis rollback --reason \"...\"` or serve another with `tentalis promote ID --reason \"...\"` "
            "(or restore its adapter folder)"
        ) from exc


def mark_promoted(lake: Lakehouse, checkpoint_id: str) -> None:
    """Set ``checkpoints.promoted`` (has been promoted at some time); it never decides what serves."""
    quoted = checkpoint_id.replace("'", "''")
    lake.update("checkpoints", f"checkpoint_id = '{quoted}'", {"promoted": "true"})


def _move(lake: Lakehouse, to: str, *, action: str, actor: str, reason: str, expect_from: str | None = None,
          default_to_previous: bool = False) -> dict[str, Any]:
    if action not in ACTIONS:
        raise ValueError(f"unknown serving action {action!r}; use one of {ACTIONS}")
    if not actor or not reason:
        raise ValueError("a change of the serving policy needs an actor and a reason")
    if not lake.exists("serving"):
        _migrate_legacy(lake)
    with lakehouse_lock(lake, "serving"):
        history = _read(lake)
        row = history[-1] if history else None
        current = BASE if row is None else row["to_checkpoint"]
        if default_to_previous:
            if row is None:
                raise ServingError("nothing to roll back: the base model serves and nothing was ever promoted")
            to = row["from_checkpoint"]
        if expect_from is not None and current != expect_from:
            raise ServingConflict(f"not serving {to!r}: the serving policy is {current!r}, not {expect_from!r} (a promotion or "
                                  "rollback moved it meanwhile, and that choice stands; promote it by hand with `tentalis promote`)")
        if to == current:
            if action == "rollback":
                raise ServingError(f"{to!r} already serves: nothing to roll back to")
            return row  # promoting what already serves changes nothing (a re-run of the gate)
        if to != BASE:
            try:
                _adapter(lake, to)
            except CheckpointError as exc:
                raise ServingError(f"cannot serve checkpoint {to}: {exc}") from exc
            taint = audit.tainted(lake, to)
            if taint is not None:
                raise ServingError(f"cannot serve checkpoint {to}: it was trained on retracted data ({taint['reason']}; "
                                   f"retraction by {taint['actor']} at {taint['at']:%Y-%m-%d %H:%M:%S} UTC, see the `audit` table)")
        new = {"seq": 1 if row is None else row["seq"] + 1, "from_checkpoint": current, "to_checkpoint": to, "action": action,
               "actor": actor, "reason": reason, "created_at": now_utc()}
        lake.append("serving", [new])
        audit.record(lake, actor=actor, action=action, subject=to, from_state=current, to_state=to, reason=reason,
                     detail={"seq": new["seq"]})
    if to != BASE:
        mark_promoted(lake, to)
    return new


def promote(lake: Lakehouse, checkpoint_id: str, *, actor: str, reason: str, action: str = "promote",
            expect_from: str | None = None) -> dict[str, Any] | None:
    """Make ``checkpoint_id`` (or 'base') the serving policy; returns the new ``serving`` row (the
    current one when it already serves). ``expect_from``: only if that is what serves now, else
    ``ServingConflict``. The checkpoint must have a row and a complete adapter."""
    return _move(lake, checkpoint_id, action=action, actor=actor, reason=reason, expect_from=expect_from)


def rollback(lake: Lakehouse, *, actor: str, reason: str, to: str | None = None) -> dict[str, Any]:
    """Serve what served before the current policy (the current row's ``from_checkpoint``), or ``to``.
    Rolling back twice returns to where you started: it is a move like any other."""
    return _move(lake, to or BASE, action="rollback", actor=actor, reason=reason, default_to_previous=to is None)


def _migrate_legacy(lake: Lakehouse) -> None:
    """A lakehouse from before the serving table: seed it once from the old rule (the newest promoted
    checkpoint) as a recorded 'migrate' row, so upgrading does not silently go back to the base model."""
    if not lake.exists("checkpoints"):
        return
    promoted = [r for r in lake.read("checkpoints", columns=["checkpoint_id", "promoted", "created_at"]).to_pylist() if r["promoted"]]
    if not promoted:
        return
    with lakehouse_lock(lake, "serving"):
        if lake.exists("serving"):
            return
        newest = max(promoted, key=lambda r: r["created_at"])["checkpoint_id"]
        reason = "seeded from checkpoints.promoted (lakehouse written before the serving table)"
        lake.append("serving", [{"seq": 1, "from_checkpoint": BASE, "to_checkpoint": newest, "action": "migrate", "actor": "reconcile",
                                 "reason": reason, "created_at": now_utc()}])
        audit.record(lake, actor="reconcile", action="migrate", subject=newest, from_state=BASE, to_state=newest, reason=reason,
                     detail={"seq": 1})
