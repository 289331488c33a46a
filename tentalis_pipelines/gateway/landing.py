"""What the gateway lands: turn rows (through the WAL), session rows (recomputed from the turns), and
live reviews; and the registry that says which tenant owns a session and which turn index comes next.

Turns are appended only when their turn id is not in ``turns`` yet, and session rows are recomputed
from ``turns`` after every append (turn count, policy versions in order, models, first and last
turn), so landing a WAL segment twice, or a crash between the two commits, never counts a turn twice.
"""

from __future__ import annotations

import hashlib
import json
import threading
from datetime import datetime
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from tentalis_pipelines.lakehouse import Lakehouse, now_utc

LIVE_BATCH = "live"
REVIEW_COMPARE = ("score", "critique", "hint", "rubric", "manager", "rollout_id")


class Forbidden(Exception):
    """The session or turn belongs to another tenant (HTTP 403)."""


class NotFound(Exception):
    """No such session or turn (HTTP 404)."""


def _ts(value: Any) -> datetime:
    return datetime.fromisoformat(value) if isinstance(value, str) else value


def select(lake: Lakehouse, name: str, columns: list[str], key: str, values: list[str]) -> list[dict[str, Any]]:
    """Rows of ``name`` whose ``key`` is one of ``values`` (only ``columns``, plus ``key``).

    The filter runs on the read columns, not as a dataset filter: should a table hold files that a
    Delta merge wrote (strings stored as ``string_view``), pyarrow's filter pushdown cannot compare
    them with the table schema's ``string`` (ArrowNotImplementedError)."""
    if not lake.exists(name):
        return []
    cols = list(dict.fromkeys([key, *columns]))
    t = lake.dataset(name).to_table(columns=cols)
    return t.filter(pc.is_in(t[key], value_set=pa.array(values, type=t.schema.field(key).type))).to_pylist()


def land_records(lake: Lakehouse, records: list[dict[str, Any]]) -> dict[str, int]:
    """Land WAL records: append the turns whose turn_id is not in ``turns`` yet, then replace the rows
    of the sessions they touch with ones recomputed from ``turns``.

    Exactly once: a record landed before (a flush that committed, then died before deleting its
    segment) is skipped by its turn id; the session rows are recomputed, never incremented. This
    relies on one writer per WAL (each gateway process flushes its own; turn ids are unique across
    processes). Neither write is a Delta merge: merge files store strings as ``string_view``, which
    pyarrow cannot filter beside plain ``string`` files (see ``Lakehouse.replace_in``).
    """
    turns: dict[str, dict[str, Any]] = {}
    metadata: dict[str, str] = {}
    for rec in records:
        if rec.get("kind") != "turn":
            continue
        row = dict(rec["row"])
        row["created_at"] = _ts(row["created_at"])
        turns[row["turn_id"]] = row  # a record landed twice in one batch is one row
        if rec.get("session_metadata"):
            metadata[row["session_id"]] = rec["session_metadata"]
    if not turns:
        return {"turns": 0, "sessions": 0}
    landed = {r["turn_id"] for r in select(lake, "turns", [], "turn_id", list(turns))}
    new = [r for tid, r in turns.items() if tid not in landed]
    if new:
        lake.append("turns", new)
    session_ids = sorted({r["session_id"] for r in turns.values()})
    lake.replace_in("sessions", "session_id", session_ids, session_rows(lake, session_ids, metadata))
    return {"turns": len(new), "sessions": len(session_ids)}


def session_rows(lake: Lakehouse, session_ids: list[str], metadata: dict[str, str]) -> list[dict[str, Any]]:
    """The ``sessions`` rows of ``session_ids``, from every turn of theirs in ``turns``."""
    cols = ["tenant", "turn_index", "choice_index", "policy_version", "model", "created_at"]
    old = {r["session_id"]: r for r in select(lake, "sessions", ["metadata"], "session_id", session_ids)}
    by_session: dict[str, list[dict[str, Any]]] = {}
    for r in select(lake, "turns", cols, "session_id", session_ids):
        by_session.setdefault(r["session_id"], []).append(r)
    rows = []
    for sid, turns in by_session.items():
        turns.sort(key=lambda r: (r["turn_index"], r["choice_index"]))
        versions = list(dict.fromkeys(r["policy_version"] for r in turns))
        models = list(dict.fromkeys(r["model"] for r in turns))
        rows.append({
            "session_id": sid, "tenant": turns[0]["tenant"], "turn_count": len({r["turn_index"] for r in turns}),
            "policy_versions": versions, "models": models,
            "first_turn_at": min(r["created_at"] for r in turns), "last_turn_at": max(r["created_at"] for r in turns),
            "metadata": metadata.get(sid) or (old.get(sid) or {}).get("metadata") or "{}",
        })
    return rows


class SessionRegistry:
    """Which tenant owns each session, and the next turn index of each, for this gateway process.

    Sessions this process has not seen are looked up in the lakehouse (complete: the WAL is replayed
    before the gateway serves). One gateway process assigns a session's turn indexes; replicas behind a
    load balancer need session affinity (route by X-Session-Id).
    """

    def __init__(self, lake: Lakehouse):
        self.lake = lake
        self._sessions: dict[str, list[Any]] = {}  # id -> [tenant, next turn index]
        self._turns: dict[str, tuple[str, str]] = {}  # turn id -> (session id, tenant)
        self._lock = threading.Lock()

    def _load(self, session_id: str) -> list[Any] | None:
        entry = self._sessions.get(session_id)
        if entry is not None:
            return entry
        rows = select(self.lake, "sessions", ["tenant", "turn_count"], "session_id", [session_id])
        if not rows:
            return None
        entry = [rows[0]["tenant"], int(rows[0]["turn_count"] or 0)]
        self._sessions[session_id] = entry
        return entry

    def owner(self, session_id: str) -> str | None:
        with self._lock:
            entry = self._load(session_id)
        return entry[0] if entry else None

    def check(self, session_id: str, tenant: str) -> None:
        """Raise ``Forbidden`` when the session exists and belongs to another tenant."""
        owner = self.owner(session_id)
        if owner is not None and owner != tenant:
            raise Forbidden(f"session {session_id!r} belongs to another tenant")

    def next_turn(self, session_id: str, tenant: str) -> int:
        """Reserve the session's next turn index (the session is created on its first turn)."""
        with self._lock:
            entry = self._load(session_id)
            if entry is None:
                entry = self._sessions[session_id] = [tenant, 0]
            if entry[0] != tenant:
                raise Forbidden(f"session {session_id!r} belongs to another tenant")
            index = entry[1]
            entry[1] += 1
            return index

    def release_turn(self, session_id: str, index: int) -> None:
        """Give back the index ``next_turn`` reserved for a call that was never recorded (the WAL append
        failed), so that the session's next turn takes it and its indexes stay without gaps."""
        with self._lock:
            entry = self._sessions.get(session_id)
            if entry is not None and entry[1] == index + 1:
                entry[1] = index

    def note_turns(self, turn_ids: list[str], session_id: str, tenant: str) -> None:
        with self._lock:
            for tid in turn_ids:
                self._turns[tid] = (session_id, tenant)

    def turn(self, turn_id: str) -> tuple[str, str] | None:
        """(session id, tenant) of a turn, or None."""
        with self._lock:
            hit = self._turns.get(turn_id)
        if hit is not None:
            return hit
        rows = select(self.lake, "turns", ["session_id", "tenant"], "turn_id", [turn_id])
        return (rows[0]["session_id"], rows[0]["tenant"]) if rows else None


def default_review_id(tenant: str, target: str, reviewer: str) -> str:
    """A re-sent review (same tenant, target and reviewer) gets the same id, so it merges onto itself."""
    return "rev-" + hashlib.sha256(f"{tenant}\x1f{target}\x1f{reviewer}".encode()).hexdigest()[:24]


# Review ids Tentalis derives itself (live reviews' default, ATIF verdicts, session judges). A client
# may send one only for its own review: otherwise a tenant could land a review under another tenant's
# future default id first, and that tenant's reviews would then be refused as another tenant's id.
MINTED_REVIEW_PREFIXES = ("rev-", "verdict-", "judge-")


def check_client_review_id(lake: Lakehouse, tenant: str, review_id: str | None, default_id: str) -> None:
    """Raise ``ValueError`` when a client-chosen ``review_id`` has a minted prefix but is neither this
    review's own default id nor the id of one of the tenant's live reviews."""
    if not review_id or review_id == default_id or not review_id.startswith(MINTED_REVIEW_PREFIXES):
        return
    mine = [r for r in select(lake, "reviews", ["batch_id", "tenant"], "review_id", [review_id])
            if r["batch_id"] == LIVE_BATCH and r["tenant"] == tenant]
    if not mine:
        raise ValueError(f"review_id {review_id!r}: ids starting with {', '.join(MINTED_REVIEW_PREFIXES)} are derived by "
                         "Tentalis; leave review_id out (one is derived from your tenant, target and reviewer) or choose "
                         "an id without those prefixes")


def review_row(*, tenant: str, session_id: str, turn_id: str | None, score: float, critique: str, hint: str,
               reviewer: str, rubric: str, review_id: str | None) -> dict[str, Any]:
    target = f"turn:{turn_id}" if turn_id else f"session:{session_id}"
    return {
        "batch_id": LIVE_BATCH, "rollout_id": turn_id or session_id, "manager": reviewer, "score": float(score),
        "critique": critique, "hint": hint, "created_at": now_utc(),
        "review_id": review_id or default_review_id(tenant, target, reviewer), "session_id": session_id,
        "reviewer": reviewer, "rubric": rubric, "tenant": tenant,
    }


def land_review(lake: Lakehouse, row: dict[str, Any]) -> bool:
    """Land one live review, keyed by review_id within its tenant: a re-sent identical review changes
    nothing (no commit); one with a new score, critique, hint, rubric or target replaces the old row.
    Returns whether it wrote.

    A review_id another tenant's live review holds raises ``Forbidden``: review ids are computable (a
    hash of tenant, target and reviewer) or chosen by the client, so one tenant could otherwise replace
    another's review. The replace itself is also limited to the row's tenant."""
    old = [r for r in select(lake, "reviews", list(REVIEW_COMPARE) + ["batch_id", "tenant"], "review_id", [row["review_id"]])
           if r["batch_id"] == LIVE_BATCH]
    if any(r["tenant"] != row["tenant"] for r in old):
        raise Forbidden(f"review_id {row['review_id']!r} belongs to another tenant's review: leave review_id out "
                        "(a default one is derived from your tenant, target and reviewer) or choose another")
    if old and all(old[0].get(c) == row[c] for c in REVIEW_COMPARE):
        return False
    lake.replace_where("reviews", {"batch_id": LIVE_BATCH, "review_id": row["review_id"], "tenant": row["tenant"]}, [row],
                       partition_by=["batch_id"])
    return True


def dumps(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"), default=str)
