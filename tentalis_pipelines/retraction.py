"""Retraction: a review, a session or a task is withdrawn, and so is everything made from it.

``retract`` (``tentalis retract --review ID | --session ID | --task ID --reason TEXT``):

1. finds the rows and what was derived from them:

   * ``--review ID`` (a ``review_id``, or ``batch_id/rollout_id/manager`` for a pipeline review, see
     ``lineage.review_key``): that review (the live row and its copies in sessions batches; for a human
     review its ``human_reviews`` source row), and the trajectories computed from it: for a single-turn
     rollout its whole group (the group's advantages were normalised with its score), for a session its
     segments;
   * ``--session ID``: the session, its turns and live reviews, and in sessions batches its task,
     rollouts, reviews and trajectories;
   * ``--task ID``: the task, its rollouts and their step scores, step labels, reviews (and human
     reviews) and trajectories;

   plus ``teacher_logprobs`` rows of the affected rollouts where that table exists, the hint-guided
   samples (``guided_rollouts``) of every affected group, and the skills an
   LLM distilled from a retracted review (``skills.source = 'llm'``, with their ``skill_decisions``);
2. deletes them (one Delta delete per table), then vacuums those tables with retention 0, so no file
   on disk holds the rows any more, and checks that by scanning every parquet file left under the
   tables' folders. The log of an unpartitioned table (``human_reviews``, ``turns``, ``sessions``) is cut
   to its current version as well (``Lakehouse.purge_log_history``): its statistics hold column
   values. Per-batch tables keep statistics on their two id columns only, so their log keeps its
   history. Time travel of those tables to versions before the retraction is lost (that is the
   point); lineage replays of checkpoints whose pinned files were rewritten fail from then on;
3. lists every checkpoint whose lineage manifest used the rows (``direct``) or that descends from one
   (``inherited from ...``: a LoRA chain starts from its parent's adapter), and marks each in ``audit``
   (action ``retraction_affects``), which makes ``training.serving`` refuse to serve it again;
4. when the serving checkpoint is affected, moves the serving pointer (action ``retract``) to the
   newest promoted checkpoint that is not, else the base model;
5. records the retraction in ``audit``: who, when, why, what was deleted, which checkpoints, the
   serving pointer before and after.

Killed part-way (SIGKILL, a power loss), a retraction is never half-applied and forgotten: before it
deletes anything it records its plan (ids and conditions only) in ``audit`` (action
``retraction_started``); the same command run again finds that intent without a ``retraction`` row after
it and finishes from the saved plan, even once the rows that named the derived ones are already gone.
Each step is idempotent (a delete of deleted rows deletes nothing; a checkpoint is marked once per
retraction), and the ``retraction`` row is written once, at the end.

Run it while no training run is in flight (it refuses while a live training claim exists): a
running trainer reads the versions that the vacuum deletes.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from tentalis_pipelines import audit, lineage
from tentalis_pipelines.lakehouse import Lakehouse, repr_sql
from tentalis_pipelines.schemas import BATCH_TABLES
from tentalis_pipelines.sessions import LIVE_BATCH
from tentalis_pipelines.training import checkpoints as ckpt
from tentalis_pipelines.training import serving

STARTED = "retraction_started"  # the audit action of a retraction's intent (its plan), recorded before any delete

# A condition: every column equals its value (AND); a table's rows to delete match any condition (OR).
Condition = Mapping[str, str]


class RetractionError(ValueError):
    """The retraction cannot be done as asked (unknown id, a training run in flight, ...)."""


@dataclass
class Retraction:
    """What one retraction did."""

    kind: str
    target: str
    reason: str
    actor: str
    deleted: dict[str, int] = field(default_factory=dict)
    vacuumed_files: dict[str, int] = field(default_factory=dict)
    purged_log_files: dict[str, int] = field(default_factory=dict)
    affected: dict[str, str] = field(default_factory=dict)
    serving_before: str = serving.BASE
    serving_after: str = serving.BASE
    review_keys: list[str] = field(default_factory=list)
    trajectory_ids: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


# --------------------------------------------------------------------------- conditions
def _predicate(conditions: Sequence[Condition]) -> str:
    return " OR ".join("(" + " AND ".join(f"{c} = {repr_sql(v)}" for c, v in sorted(cond.items())) + ")" for cond in conditions)


def _matches(table: pa.Table, conditions: Sequence[Condition]) -> int:
    """Rows of ``table`` matching any condition whose columns it has (string_view columns, which
    delta-rs writes when it rewrites files, compared as strings)."""
    mask = None
    for cond in conditions:
        if not all(c in table.column_names for c in cond):
            continue
        part = None
        for c, v in cond.items():
            col = table.column(c)
            if pa.types.is_string_view(col.type) or pa.types.is_large_string(col.type):
                col = col.cast(pa.string())
            term = pc.equal(col, pa.scalar(v, pa.string()))
            part = term if part is None else pc.and_(part, term)
        mask = part if mask is None else pc.or_(mask, part)
    return 0 if mask is None else int(pc.sum(pc.fill_null(mask, False).cast(pa.int64())).as_py() or 0)


def _rows(lake: Lakehouse, name: str) -> list[dict[str, Any]]:
    return lake.read(name).to_pylist() if lake.exists(name) else []


def _optional_table(lake: Lakehouse, name: str):
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    try:
        return DeltaTable(f"{lake.root.rstrip('/')}/{name}", storage_options=lake._storage_options)
    except TableNotFoundError:
        return None


# --------------------------------------------------------------------------- what goes
def _group_trajectories(lake: Lakehouse, batch_rollouts: dict[str, set[str]]) -> list[dict]:
    """Trajectories derived from the given (batch -> rollout ids): single-turn ones with every member of
    their (batch, task) group; multi-turn ones by themselves."""
    out = []
    for batch, rids in batch_rollouts.items():
        rows = lake.read("trajectories", batch_id=batch).to_pylist() if lake.exists("trajectories") else []
        groups = {r["task_id"] for r in rows if r["rollout_id"] in rids and r.get("kind") != "multi_turn"}
        out += [r for r in rows if r["rollout_id"] in rids or (r.get("kind") != "multi_turn" and r["task_id"] in groups)]
    return out


def plan(lake: Lakehouse, *, review: str | None = None, session: str | None = None, task: str | None = None
         ) -> tuple[dict[str, list[Condition]], list[str], list[str]]:
    """The rows a retraction deletes, per table (as conditions), with the review keys and trajectory
    (rollout) ids among them. Raises ``RetractionError`` when nothing matches the id."""
    given = [(k, v) for k, v in (("review", review), ("session", session), ("task", task)) if v]
    if len(given) != 1:
        raise RetractionError("give exactly one of --review ID, --session ID, --task ID")
    kind, target = given[0]
    deletes: dict[str, list[Condition]] = {}
    reviews = _rows(lake, "reviews")
    gone_reviews: list[dict] = []
    derived: dict[str, set[str]] = {}  # batch -> rollout ids whose trajectories derive from the retracted rows
    rollouts_hit: list[dict] = []  # (batch_id, rollout_id) rows of rollouts that go

    if kind == "review":
        gone_reviews = [r for r in reviews if lineage.review_key(r) == target or (r.get("review_id") and r["review_id"] == target)]
        if not gone_reviews:
            raise RetractionError(f"no review {target!r}: give a review_id or batch_id/rollout_id/manager "
                                  "(`tentalis sql \"select review_id, batch_id, rollout_id, manager from reviews\"`)")
        for r in gone_reviews:
            if r["batch_id"] == LIVE_BATCH:
                continue
            if r.get("session_id"):  # a sessions batch: the session's segments used every review of the session
                ro = lake.read("rollouts", batch_id=r["batch_id"], columns=["rollout_id", "session_id"]).to_pylist()
                derived.setdefault(r["batch_id"], set()).update(x["rollout_id"] for x in ro if x["session_id"] == r["session_id"])
            else:
                derived.setdefault(r["batch_id"], set()).add(r["rollout_id"])
            if r["manager"] == "human":
                deletes.setdefault("human_reviews", []).append({"batch_id": r["batch_id"], "rollout_id": r["rollout_id"]})
    elif kind == "session":
        turns = [t for t in _rows(lake, "turns") if t["session_id"] == target]
        turn_ids = {t["turn_id"] for t in turns}
        rollouts = [r for r in _rows(lake, "rollouts") if r.get("session_id") == target]
        gone_reviews = [r for r in reviews if r.get("session_id") == target or r["rollout_id"] == target or r["rollout_id"] in turn_ids]
        in_sessions = any(s["session_id"] == target for s in _rows(lake, "sessions"))
        if not (turns or rollouts or gone_reviews or in_sessions):
            raise RetractionError(f"no session {target!r} in sessions, turns, rollouts or reviews")
        deletes["sessions"] = [{"session_id": target}]
        deletes["turns"] = [{"session_id": target}]
        deletes["tasks"] = [{"batch_id": r["batch_id"], "task_id": target} for r in rollouts]
        rollouts_hit = rollouts
        for r in rollouts:
            derived.setdefault(r["batch_id"], set()).add(r["rollout_id"])
    else:
        tasks = [t for t in _rows(lake, "tasks") if t["task_id"] == target]
        rollouts = [r for r in _rows(lake, "rollouts") if r["task_id"] == target]
        if not (tasks or rollouts):
            raise RetractionError(f"no task {target!r} in tasks or rollouts")
        deletes["tasks"] = [{"batch_id": t["batch_id"], "task_id": target} for t in tasks]
        rollouts_hit = rollouts
        hit = {(r["batch_id"], r["rollout_id"]) for r in rollouts}
        gone_reviews = [r for r in reviews if (r["batch_id"], r["rollout_id"]) in hit]
        for r in rollouts:
            derived.setdefault(r["batch_id"], set()).add(r["rollout_id"])
            for name in ("step_scores", "step_labels", "human_reviews"):
                deletes.setdefault(name, []).append({"batch_id": r["batch_id"], "rollout_id": r["rollout_id"]})

    if rollouts_hit:
        deletes["rollouts"] = [{"batch_id": r["batch_id"], "rollout_id": r["rollout_id"]} for r in rollouts_hit]
    if gone_reviews:
        deletes["reviews"] = [{"review_id": r["review_id"]} if r.get("review_id") else
                              {"batch_id": r["batch_id"], "rollout_id": r["rollout_id"], "manager": r["manager"]} for r in gone_reviews]
    trajectories = _group_trajectories(lake, derived)
    if trajectories:
        deletes["trajectories"] = [{"batch_id": t["batch_id"], "rollout_id": t["rollout_id"]} for t in trajectories]
        if _optional_table(lake, "teacher_logprobs") is not None:
            deletes["teacher_logprobs"] = [{"rollout_id": t["rollout_id"]} for t in trajectories]
    if lake.exists("guided_rollouts"):  # hinted samples of a hit group copy its hint: they go with it
        groups = {(t["batch_id"], t["task_id"]) for t in trajectories if t.get("kind") != "multi_turn"}
        groups |= {(b, r["task_id"]) for b, rids in derived.items()
                   for r in lake.read("rollouts", batch_id=b, columns=["rollout_id", "task_id"]).to_pylist() if r["rollout_id"] in rids}
        deletes["guided_rollouts"] = [{"batch_id": g["batch_id"], "rollout_id": g["rollout_id"]}
                                      for b in sorted({b for b, _ in groups})
                                      for g in lake.read("guided_rollouts", batch_id=b, columns=["batch_id", "rollout_id", "task_id"]).to_pylist()
                                      if (b, g["task_id"]) in groups]
    for name, conditions in _distilled_skills(lake, {r["rollout_id"] for r in [*gone_reviews, *rollouts_hit]}).items():
        deletes.setdefault(name, []).extend(conditions)
    deletes = {k: _dedupe(v) for k, v in deletes.items() if v}
    return deletes, sorted({lineage.review_key(r) for r in gone_reviews}), sorted({t["rollout_id"] for t in trajectories})


def _distilled_skills(lake: Lakehouse, rollout_ids: set[str]) -> dict[str, list[Condition]]:
    """The skills an LLM distilled from any of the retracted reviews (``source = 'llm'``: their text is
    written from the critiques) and their ``skill_decisions`` rows (which copy the text). Template
    skills keep: their text is a fixed sentence per failure type, nothing of the review's."""
    if not rollout_ids or not lake.exists("skills"):
        return {}
    ids = sorted({s["skill_id"] for s in lake.read("skills").to_pylist()
                  if s.get("source") == "llm" and rollout_ids & set(s.get("source_review_ids") or ())})
    out: dict[str, list[Condition]] = {"skills": [{"skill_id": i} for i in ids]} if ids else {}
    if ids and lake.exists("skill_decisions"):
        out["skill_decisions"] = [{"skill_id": i} for i in ids]
    return out


def _dedupe(conditions: list[Condition]) -> list[Condition]:
    seen, out = set(), []
    for c in conditions:
        key = tuple(sorted(c.items()))
        if key not in seen:
            seen.add(key)
            out.append(dict(c))
    return out


# --------------------------------------------------------------------------- deleting for real
def _table_dir(lake: Lakehouse, name: str) -> Path:
    return Path(lake.root) / name


def remaining_matches(lake: Lakehouse, name: str, conditions: Sequence[Condition]) -> int:
    """Rows matching ``conditions`` in any parquet file under the table's folder (every version's
    files still on disk, not only the current snapshot's): 0 once a retraction is complete."""
    needed = {c for cond in conditions for c in cond}
    found = 0
    for path in sorted(_table_dir(lake, name).rglob("*.parquet")):
        if "_delta_log" in path.parts:
            continue
        names = set(pq.read_schema(path).names)
        # A partition column (batch_id) lives in the folder name, not in the file.
        table = pq.read_table(path, columns=sorted(needed & names))
        for part in path.relative_to(_table_dir(lake, name)).parts[:-1]:
            key, _, value = part.partition("=")
            if key in needed and key not in names:
                table = table.append_column(key, pa.array([unquote(value)] * table.num_rows, pa.string()))
        found += _matches(table, conditions)
    return found


def _delete(lake: Lakehouse, name: str, conditions: Sequence[Condition]) -> tuple[int, int]:
    """Delete, then vacuum with retention 0; returns (rows deleted, files vacuumed)."""
    if name in lake_schema_names():
        deleted = lake.delete(name, _predicate(conditions))
        # full=False: only the files commits removed (the delete's), never a concurrent writer's uncommitted ones.
        files = lake.vacuum(name, 0, allow_unsafe_retention=True, full=False)
    else:  # a table another feature added (teacher_logprobs): plain deltalake
        dt = _optional_table(lake, name)
        if dt is None or not all(c in dt.schema().to_arrow().names for cond in conditions for c in cond):
            return 0, 0
        deleted = int(dt.delete(_predicate(conditions)).get("num_deleted_rows", 0) or 0)
        files = dt.vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=False, full=False)
    return deleted, len(files)


def lake_schema_names() -> set[str]:
    from tentalis_pipelines.schemas import SCHEMAS

    return set(SCHEMAS)


def _fallback_target(lake: Lakehouse, affected: Mapping[str, str]) -> str:
    """The newest promoted checkpoint that no retraction affected and whose adapter is complete, else base."""
    if not lake.exists("checkpoints"):
        return serving.BASE
    rows = sorted(lake.read("checkpoints").to_pylist(), key=lambda r: r["created_at"], reverse=True)
    for r in rows:
        if not r["promoted"] or r["checkpoint_id"] in affected or audit.tainted(lake, r["checkpoint_id"]) is not None:
            continue
        try:
            ckpt.verify_adapter(r["adapter_uri"])
        except ckpt.CheckpointError:
            continue
        return r["checkpoint_id"]
    return serving.BASE


def retract(lake: Lakehouse, *, reason: str, actor: str, review: str | None = None, session: str | None = None,
            task: str | None = None) -> Retraction:
    """Withdraw a review, a session or a task and everything derived from it (see the module docstring)."""
    if not reason or not reason.strip():
        raise RetractionError("a retraction needs a reason (--reason TEXT): it is kept in the audit table")
    if lake.is_object_store:
        raise RetractionError("retraction checks the files on disk after vacuum and needs a local lakehouse; "
                              "on an object store run it against a local mount, or delete and vacuum with deltalake")
    live = [c for c in ckpt.active_claims(lake) if c.alive()] if lake.exists("training_claims") else []
    if live:
        raise RetractionError(f"a training run is in flight ({live[0].holder()}): its reads need the versions the vacuum "
                              "deletes. Retract when it has finished")
    given = [(k, v) for k, v in (("review", review), ("session", session), ("task", task)) if v]
    if len(given) != 1:
        raise RetractionError("give exactly one of --review ID, --session ID, --task ID")
    kind, target = given[0]
    subject = f"{kind} {target}"
    pending = pending_retraction(lake, subject)
    try:
        deletes, review_keys, trajectory_ids = plan(lake, review=review, session=session, task=task)
    except RetractionError:
        if pending is None:
            raise
        deletes, review_keys, trajectory_ids = {}, [], []  # the rows that named it are gone: the saved plan finishes it
    out = Retraction(kind=kind, target=target, reason=reason, actor=actor)
    affected = lineage.checkpoints_using(lake, trajectories=trajectory_ids, reviews=review_keys)
    if pending is not None:
        saved = json.loads(pending["detail"])
        for name, conditions in saved["deletes"].items():
            deletes[name] = _dedupe(list(conditions) + deletes.get(name, []))
        review_keys = sorted(set(review_keys) | set(saved["review_keys"]))
        trajectory_ids = sorted(set(trajectory_ids) | set(saved["trajectory_ids"]))
        affected = {**saved["affected"], **affected}
        out.serving_before = saved["serving_before"]
    else:
        out.serving_before = serving.serving_checkpoint(lake)
        # The intent first (ids only): killed anywhere after this, the same command again finds it and
        # finishes the retraction from this plan, even once the rows that named the derived ones are gone.
        audit.record(lake, actor=actor, action=STARTED, subject=subject, reason=reason,
                     detail={"deletes": deletes, "review_keys": review_keys, "trajectory_ids": trajectory_ids,
                             "affected": affected, "serving_before": out.serving_before})
    out.review_keys, out.trajectory_ids, out.affected = review_keys, trajectory_ids, affected

    for name, conditions in deletes.items():
        out.deleted[name], out.vacuumed_files[name] = _delete(lake, name, conditions)
        if name in lake_schema_names() and name not in BATCH_TABLES and lake.exists(name) and (out.deleted[name] or pending):
            # Unpartitioned tables keep statistics on every column: their old log commits hold text.
            out.purged_log_files[name] = lake.purge_log_history(name)
    for name, conditions in deletes.items():
        left = remaining_matches(lake, name, conditions)
        if left:
            raise RetractionError(f"{left} retracted rows of {name!r} are still in files on disk after vacuum")

    already = {r["subject"] for r in audit.rows(lake, action=audit.TAINTED)
               if r["detail"] and json.loads(r["detail"]).get("retraction") == subject}
    for cid, how in out.affected.items():
        if cid not in already:  # a resumed retraction does not mark a checkpoint twice
            audit.record(lake, actor=actor, action=audit.TAINTED, subject=cid, from_state=subject, to_state=None, reason=reason,
                         detail={"how": how, "retraction": subject})
    out.serving_after = serving.serving_checkpoint(lake)
    if out.serving_after in out.affected:
        to = _fallback_target(lake, out.affected)
        serving.promote(lake, to, actor=actor, action="retract",
                        reason=f"retraction of {subject}: {out.serving_after} was trained on it ({out.affected[out.serving_after]}); {reason}")
        out.serving_after = to
    audit.record(lake, actor=actor, action="retraction", subject=subject, from_state=out.serving_before, to_state=out.serving_after,
                 reason=reason, detail={"deleted": out.deleted, "vacuumed_files": out.vacuumed_files, "affected": out.affected,
                                        "review_keys": review_keys, "trajectories": len(trajectory_ids),
                                        "resumed": pending is not None})
    return out


def pending_retraction(lake: Lakehouse, subject: str) -> dict[str, Any] | None:
    """The intent row of a retraction of ``subject`` that began and never finished (killed), or None."""
    started = audit.rows(lake, action=STARTED, subject=subject)
    if not started:
        return None
    done = audit.rows(lake, action="retraction", subject=subject)
    return None if done and done[-1]["at"] >= started[-1]["at"] else started[-1]


def summary(result: Retraction) -> str:
    """One JSON line for logs (ids and counts; no retracted content)."""
    return json.dumps(result.as_dict(), sort_keys=True, default=str)
