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

The **manager** (the llm reviewer, trained by ``training/manager_rl.py``) has a serving pointer of its own
with the same rules: ``role="manager"`` reads and moves ``manager_serving`` over ``manager_checkpoints``
(``ROLES``), so ``tentalis promote --role manager`` and ``rollback --role manager`` work as for the worker.

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
# role -> (its checkpoints table, its serving log). The worker's names are the historical ones.
ROLES = {"worker": ("checkpoints", "serving"), "manager": ("manager_checkpoints", "manager_serving")}


def role_tables(role: str) -> tuple[str, str]:
    """(checkpoints table, serving table) of ``role``; a clear error for an unknown role."""
    try:
        return ROLES[role]
    except KeyError:
        raise ValueError(f"unknown role {role!r}: choose one of {', '.join(ROLES)}") from None


class ServingError(RuntimeError):
    """The serving policy cannot be used or moved as asked."""


class ServingConflict(ServingError):
    """The serving policy is not the one the caller expected (someone moved it meanwhile)."""


def serving_history(lake: Lakehouse, role: str = "worker") -> list[dict[str, Any]]:
    """Every change of ``role``'s serving policy, oldest first (by ``seq``)."""
    _, table = role_tables(role)
    if role == "worker" and not lake.exists(table):
        _migrate_legacy(lake)
    if not lake.exists(table):
        return []
    return _read(lake, table)


def _read(lake: Lakehouse, table: str = "serving") -> list[dict[str, Any]]:
    if not lake.exists(table):
        return []
    return sorted(lake.read(table).to_pylist(), key=lambda r: (r["seq"], r["created_at"]))


def current_row(lake: Lakehouse, role: str = "worker") -> dict[str, Any] | None:
    """The serving table's row with the highest seq, or None (the base model serves)."""
    history = serving_history(lake, role)
    return history[-1] if history else None


def serving_checkpoint(lake: Lakehouse, role: str = "worker") -> str:
    """The id of the serving checkpoint ('base' for the base model), without checking its files."""
    row = current_row(lake, role)
    return BASE if row is None else row["to_checkpoint"]


def _adapter(lake: Lakehouse, checkpoint_id: str, role: str = "worker") -> str:
    table, _ = role_tables(role)
    row = checkpoint_row(lake, checkpoint_id, table=table)
    if row is None:
        raise ServingError(f"checkpoint {checkpoint_id!r} has no row in `{table}`")
    return verify_adapter(row["adapter_uri"]).as_posix()


def serving_policy(lake: Lakehouse, role: str = "worker") -> tuple[str, str | None]:
    """(checkpoint_id, adapter folder) of the serving policy, or ('base', None).

    A serving checkpoint whose adapter is missing or incomplete raises ``ServingError``: it is never
    replaced silently by another adapter."""
    checkpoint_id = serving_checkpoint(lake, role)
    if checkpoint_id == BASE:
        return BASE, None
    flag = "" if role == "worker" else f" --role {role}"
    try:
        return checkpoint_id, _adapter(lake, checkpoint_id, role)
    except (CheckpointError, ServingError) as exc:
        raise ServingError(
            f"the serving checkpoint {checkpoint_id} cannot be loaded: {exc}. Nothing else is served in its place: "
            f"go back with `tentalis rollback{flag} --reason \"...\"` or serve another with `tentalis promote{flag} ID --reason \"...\"` "
            "(or restore its adapter folder)"
        ) from exc


def mark_promoted(lake: Lakehouse, checkpoint_id: str, role: str = "worker") -> None:
    """Set ``<role's checkpoints>.promoted`` (has been promoted at some time); it never decides what serves."""
    table, _ = role_tables(role)
    quoted = checkpoint_id.replace("'", "''")
    lake.update(table, f"checkpoint_id = '{quoted}'", {"promoted": "true"})


def _move(lake: Lakehouse, to: str, *, action: str, actor: str, reason: str, expect_from: str | None = None,
          default_to_previous: bool = False, role: str = "worker") -> dict[str, Any]:
    if action not in ACTIONS:
        raise ValueError(f"unknown serving action {action!r}; use one of {ACTIONS}")
    if not actor or not reason:
        raise ValueError("a change of the serving policy needs an actor and a reason")
    _, table = role_tables(role)
    if role == "worker" and not lake.exists(table):
        _migrate_legacy(lake)
    with lakehouse_lock(lake, table):
        history = _read(lake, table)
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
                _adapter(lake, to, role)
            except CheckpointError as exc:
                raise ServingError(f"cannot serve checkpoint {to}: {exc}") from exc
            taint = audit.tainted(lake, to)
            if taint is not None:
                raise ServingError(f"cannot serve checkpoint {to}: it was trained on retracted data ({taint['reason']}; "
                                   f"retraction by {taint['actor']} at {taint['at']:%Y-%m-%d %H:%M:%S} UTC, see the `audit` table)")
        new = {"seq": 1 if row is None else row["seq"] + 1, "from_checkpoint": current, "to_checkpoint": to, "action": action,
               "actor": actor, "reason": reason, "created_at": now_utc()}
        lake.append(table, [new])
        audit.record(lake, actor=actor, action=action, subject=to, from_state=current, to_state=to, reason=reason,
                     detail={"seq": new["seq"], **({} if role == "worker" else {"role": role})})
    if to != BASE:
        mark_promoted(lake, to, role)
    return new


def promote(lake: Lakehouse, checkpoint_id: str, *, actor: str, reason: str, action: str = "promote",
            expect_from: str | None = None, role: str = "worker") -> dict[str, Any] | None:
    """Make ``checkpoint_id`` (or 'base') ``role``'s serving policy; returns the new serving row (the
    current one when it already serves). ``expect_from``: only if that is what serves now, else
    ``ServingConflict``. The checkpoint must have a row and a complete adapter."""
    return _move(lake, checkpoint_id, action=action, actor=actor, reason=reason, expect_from=expect_from, role=role)


def rollback(lake: Lakehouse, *, actor: str, reason: str, to: str | None = None, role: str = "worker") -> dict[str, Any]:
    """Serve what served before the current policy (the current row's ``from_checkpoint``), or ``to``.
    Rolling back twice returns to where you started: it is a move like any other."""
    return _move(lake, to or BASE, action="rollback", actor=actor, reason=reason, default_to_previous=to is None, role=role)


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
