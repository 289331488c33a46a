"""The ``audit`` table: one row per decision about what serves or what the lakehouse keeps.

Every serving move (promote, rollback, gate, reconcile, migrate, retract; written by
``training.serving``), every promotion-gate decision (``promotion.decide_promotion``) and every
retraction (``retraction.retract``, plus one row per checkpoint it affects) is a row: who (actor),
when (at), what (action, subject), from what to what, and why (reason), with the numbers behind it
as JSON (detail). The table is append-only; nothing in Tentalis deletes from it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tentalis_pipelines.lakehouse import Lakehouse, dumps, now_utc

# A checkpoint trained on retracted data (directly or through its parent's adapter) gets a row with
# this action; ``training.serving`` refuses to serve it again.
TAINTED = "retraction_affects"


def record(lake: Lakehouse, *, actor: str, action: str, subject: str, reason: str, from_state: str | None = None,
           to_state: str | None = None, detail: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Append one audit row and return it."""
    if not actor or not action or not reason:
        raise ValueError("an audit row needs an actor, an action and a reason")
    row = {"actor": actor, "at": now_utc(), "action": action, "subject": subject, "from_state": from_state,
           "to_state": to_state, "reason": reason, "detail": dumps(dict(detail)) if detail is not None else None}
    lake.append("audit", [row])
    return row


def rows(lake: Lakehouse, *, action: str | None = None, subject: str | None = None) -> list[dict[str, Any]]:
    """Audit rows (optionally of one action and/or subject), oldest first."""
    if not lake.exists("audit"):
        return []
    out = [r for r in lake.read("audit").to_pylist()
           if (action is None or r["action"] == action) and (subject is None or r["subject"] == subject)]
    return sorted(out, key=lambda r: r["at"])


def tainted(lake: Lakehouse, checkpoint_id: str) -> dict[str, Any] | None:
    """The audit row saying ``checkpoint_id`` was trained on retracted data, or None."""
    found = rows(lake, action=TAINTED, subject=checkpoint_id)
    return found[-1] if found else None
