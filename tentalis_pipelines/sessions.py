"""From live sessions to training: sessions batches and their per-batch stages.

The gateway (``tentalis serve``) lands every model call in ``turns`` (and ``sessions``) and every
review posted to ``POST /v1/reviews`` in ``reviews`` under ``batch_id = 'live'`` (``rollout_id`` = the
turn id for a turn-level review, the session id for a session-level one). The ``fresh_sessions`` sensor
cuts reviewed sessions that no batch holds yet into a task batch ``sessions-<hash>`` (its session ids
snapshotted under ``$TENTALIS_HOME/batches/<id>/sessions.json``, the turns it holds in
``turn_ranges.json``), once; with a judge configured, also the sessions that nobody reviewed within
``$TENTALIS_SESSION_REVIEW_WAIT_SECONDS``. Turns a session gets after its cut are cut again later, as a
continuation (a batch holding only those turns, the earlier ones as context). Such a batch is of the
sessions batch kind (``stages/kinds.py``: ``SessionsBatch``), which hands the usual stages to the functions
here instead of sampling:

* tasks: one per session (environment ``chat``, task id = the session id, prompt = the first user
  message, the session's *family* in metadata);
* rollouts: one per session segment, built from the turns (never generated again): the exact tokens
  the model saw and sampled, the assistant mask, each assistant turn's span, the policy version that
  answered (``training/multiturn.py`` says how);
* step_scores: none (chat turns state no checkable steps);
* reviews: the live reviews of the batch's sessions, copied into the batch; a session that no person
  reviewed gets the judge's review (the llm manager, ``manager = 'judge'``) when one is configured;
* trajectories: ``kind = 'multi_turn'`` rows with the loss mask and per-token advantages that the
  trainer rebuilds the sample from (``training/samples.py``: ``multi_turn_sample``).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow.compute as pc

from tentalis_pipelines import contamination
from tentalis_pipelines.lakehouse import Lakehouse, now_utc, validate_batch_id
from tentalis_pipelines.rewards.scoring import DEFAULT_WEIGHTS, combine
from tentalis_pipelines.training import multiturn, opd
from tentalis_pipelines.training.policy_lag import with_policy_lag

if TYPE_CHECKING:
    from tentalis_pipelines.rewards.llm_manager import LLMManager

SOURCE = "live-sessions"
LIVE_BATCH = "live"  # the reviews partition that POST /v1/reviews lands in
MANIFEST_KIND = "sessions"
MAX_SESSIONS_PER_BATCH = 512


# --------------------------------------------------------------------------- cutting batches
def sessions_batch_id(session_ids: list[str], starts: dict[str, int] | None = None) -> str:
    """``sessions-<hash>`` of the sorted session ids; a continuation (a session cut again from turn ``k``)
    enters the hash as ``id@k``, so it never collides with the session's first cut."""
    keys = [f"{s}@{starts[s]}" if starts and starts.get(s) else s for s in session_ids]
    digest = hashlib.sha256("\x1f".join(sorted(keys)).encode()).hexdigest()[:12]
    return f"sessions-{digest}"


RANGES_FILE = "turn_ranges.json"


def register_sessions_batch(batches_dir: Path, session_ids: list[str], ranges: dict[str, tuple[int, int]] | None = None) -> str:
    """Snapshot a cut of sessions as a batch (idempotent: the id is a hash of the sorted session ids).

    ``ranges`` (session id -> (first, last) turn index) records which turns the cut holds: the turns a
    session had when it was cut. Turns it gets later are cut again as a continuation. A cut without
    ranges (as batches were before continuations) holds every turn of its sessions."""
    ids = sorted(set(session_ids))
    if not ids:
        raise ValueError("a sessions batch needs at least one session")
    ranges = {sid: (int(ranges[sid][0]), int(ranges[sid][1])) for sid in ids} if ranges is not None else None
    batch_id = validate_batch_id(sessions_batch_id(ids, {sid: r[0] for sid, r in ranges.items()} if ranges else None))
    folder = batches_dir / batch_id
    folder.mkdir(parents=True, exist_ok=True)
    if not (folder / "manifest.json").exists():
        manifest = {"kind": MANIFEST_KIND, "file": "sessions.json", "sessions": len(ids)}
        files = [("sessions.json", json.dumps(ids))]
        if ranges is not None:
            manifest["ranges"] = RANGES_FILE
            files.append((RANGES_FILE, json.dumps({sid: list(r) for sid, r in ranges.items()})))
        for name, text in (*files, ("manifest.json", json.dumps(manifest))):  # the manifest last: it marks the cut done
            tmp = folder / f".{name}.tmp-{os.getpid()}"
            tmp.write_text(text, encoding="utf-8")
            os.replace(tmp, folder / name)
    return batch_id


def is_sessions_manifest(batches_dir: Path, batch_id: str) -> bool:
    path = batches_dir / validate_batch_id(batch_id) / "manifest.json"
    return path.exists() and json.loads(path.read_text()).get("kind") == MANIFEST_KIND


def batch_session_ids(batches_dir: Path, batch_id: str) -> list[str]:
    folder = batches_dir / validate_batch_id(batch_id)
    manifest = json.loads((folder / "manifest.json").read_text())
    return list(json.loads((folder / manifest["file"]).read_text()))


def batch_turn_ranges(batches_dir: Path, batch_id: str) -> dict[str, tuple[int, int]] | None:
    """session id -> (first, last) turn index that the batch holds; None for a cut that recorded no
    ranges (it holds every turn of its sessions)."""
    folder = batches_dir / validate_batch_id(batch_id)
    manifest = json.loads((folder / "manifest.json").read_text())
    if not manifest.get("ranges"):
        return None
    return {sid: (int(r[0]), int(r[1])) for sid, r in json.loads((folder / manifest["ranges"]).read_text()).items()}


def cut_sessions(batches_dir: Path) -> dict[str, list[str]]:
    """Every registered sessions batch and its session ids (the record of what was cut)."""
    out = {}
    if not batches_dir.exists():
        return out
    for manifest in sorted(batches_dir.glob("sessions-*/manifest.json")):
        try:
            if json.loads(manifest.read_text()).get("kind") == MANIFEST_KIND:
                out[manifest.parent.name] = batch_session_ids(batches_dir, manifest.parent.name)
        except (OSError, ValueError):
            continue
    return out


EVERY_TURN = 2**62  # "cut up to here": a cut without ranges holds every turn the session will ever have


def cut_turns(batches_dir: Path) -> dict[str, int]:
    """session id -> the last turn index any batch holds (``EVERY_TURN`` for a cut without ranges)."""
    out: dict[str, int] = {}
    for batch_id, ids in cut_sessions(batches_dir).items():
        try:
            ranges = batch_turn_ranges(batches_dir, batch_id)
        except (OSError, ValueError):
            ranges = None
        for sid in ids:
            last = ranges[sid][1] if ranges and sid in ranges else EVERY_TURN
            out[sid] = max(out.get(sid, -1), last)
    return out


def live_reviews(lake: Lakehouse) -> list[dict]:
    if not lake.exists("reviews"):
        return []
    return lake.read("reviews", batch_id=LIVE_BATCH).to_pylist()


def _read_turns(lake: Lakehouse, session_ids: list[str] | None = None, columns: list[str] | None = None) -> list[dict]:
    if not lake.exists("turns"):
        return []
    ds = lake.dataset("turns")
    flt = pc.field("session_id").isin(sorted(session_ids)) if session_ids is not None else None
    return ds.to_table(columns=columns, filter=flt).to_pylist()


def review_session_ids(reviews: list[dict], turn_sessions: dict[str, str]) -> dict[str, list[dict]]:
    """session id -> its reviews: by the ``session_id`` column, else the target (a session or turn id)."""
    out: dict[str, list[dict]] = defaultdict(list)
    for r in reviews:
        sid = r.get("session_id") or turn_sessions.get(r["rollout_id"]) or r["rollout_id"]
        out[sid].append(r)
    return out


def reviews_of_turns(session_id: str, reviews: list[dict], turn_index: dict[str, int], first: int, last: int,
                     first_at: Any = None) -> list[dict]:
    """The reviews that judge a session's turns ``first``..``last``: reviews of those turns, and reviews of
    the whole session. For a continuation (``first`` > 0) a session review counts only when it was made
    after the continuation's first turn (``first_at``): an earlier verdict never saw those turns."""
    out = []
    for r in reviews:
        target = r["rollout_id"]
        if target in turn_index:
            if first <= turn_index[target] <= last:
                out.append(r)
        elif first == 0 or (target == session_id and first_at is not None and r.get("created_at") is not None
                            and r["created_at"] >= first_at):
            out.append(r)
    return out


def plan_cut(lake: Lakehouse, batches_dir: Path, *, settle_seconds: float = 0.0, review_wait_seconds: float | None = None,
             now: float | None = None, limit: int = MAX_SESSIONS_PER_BATCH) -> dict[str, tuple[int, int]]:
    """The next cut: session id -> (first, last) turn index, oldest session first, at most ``limit``.

    A session is due once it has had no new turn for ``settle_seconds`` (a session still in use is cut
    later) and its turns that no batch holds yet (all of them, or those after its last cut: a
    *continuation*) have a review: of one of those turns, or of the session (for a continuation, one
    made after its first new turn). With ``review_wait_seconds`` (given when a judge is configured),
    turns that nobody reviewed are cut too once the session has had no new turn for that long (and
    for ``settle_seconds``): their managers had the time to review, and the judge reviews them in the
    batch's ``reviews`` stage."""
    reviews = live_reviews(lake)
    if not reviews and review_wait_seconds is None:
        return {}
    turns = _read_turns(lake, columns=["turn_id", "session_id", "turn_index", "created_at"])
    turn_sessions = {t["turn_id"]: t["session_id"] for t in turns}
    turn_index = {t["turn_id"]: int(t["turn_index"]) for t in turns}
    by_session: dict[str, list[dict]] = defaultdict(list)
    for t in turns:
        by_session[t["session_id"]].append(t)
    covered = cut_turns(batches_dir)
    session_reviews = review_session_ids(reviews, turn_sessions)
    now = time.time() if now is None else now
    due: dict[str, tuple[int, int]] = {}
    last_at: dict[str, float] = {}
    for sid, rows in by_session.items():
        first = covered.get(sid, -1) + 1
        new = [t for t in rows if int(t["turn_index"]) >= first]
        if not new:
            continue
        last_at[sid] = max((t["created_at"].timestamp() if t["created_at"] is not None else 0.0) for t in rows)
        first_at = min((t["created_at"] for t in new if t["created_at"] is not None), default=None)
        reviewed = bool(reviews_of_turns(sid, session_reviews.get(sid, []), turn_index, first, EVERY_TURN, first_at))
        wait = settle_seconds if reviewed else (None if review_wait_seconds is None else max(settle_seconds, review_wait_seconds))
        if wait is not None and now - last_at[sid] >= wait:
            due[sid] = (first, max(int(t["turn_index"]) for t in new))
    order = sorted(due, key=lambda s: (last_at[s], s))[:limit]
    return {sid: due[sid] for sid in order}


def sessions_to_cut(lake: Lakehouse, batches_dir: Path, *, settle_seconds: float = 0.0, review_wait_seconds: float | None = None,
                    now: float | None = None, limit: int = MAX_SESSIONS_PER_BATCH) -> list[str]:
    """The session ids of :func:`plan_cut`: the sessions due for a batch, oldest first."""
    return list(plan_cut(lake, batches_dir, settle_seconds=settle_seconds, review_wait_seconds=review_wait_seconds, now=now, limit=limit))


def is_sessions_batch(lake: Lakehouse, batch_id: str) -> bool:
    """Whether a batch's tasks are live sessions: the rule by which ``stages.kinds.batch_kind`` picks the
    sessions kind (ask the resolver, not this)."""
    if not lake.exists("tasks"):
        return False
    sources = lake.read("tasks", batch_id=batch_id, columns=["source"]).column("source").to_pylist()
    return bool(sources) and all(s == SOURCE for s in sources)


# --------------------------------------------------------------------------- stages
def _first_user_message(messages: list) -> str:
    for m in messages:
        if isinstance(m, dict) and m.get("role") == "user":
            content = m.get("content")
            return content if isinstance(content, str) else json.dumps(content)
    return ""


def _messages(raw: str | None) -> list:
    try:
        msgs = json.loads(raw or "[]")
    except ValueError:
        return []
    return msgs if isinstance(msgs, list) else [{"role": "user", "content": str(msgs)}]


def build_session_tasks(lake: Lakehouse, batches_dir: Path, batch_id: str) -> tuple[int, dict[str, Any]]:
    """One ``chat`` task per session of the batch (prompt = its first user message; the turns the cut
    holds in ``turn_range`` of the metadata). A session whose turns are gone, or whose first user
    message is a held-out or benchmark item, goes to quarantine."""
    ids = batch_session_ids(batches_dir, batch_id)
    ranges = batch_turn_ranges(batches_dir, batch_id)
    by_session: dict[str, list[dict]] = defaultdict(list)
    for t in _read_turns(lake, ids, columns=["session_id", "tenant", "turn_index", "choice_index", "messages", "policy_version"]):
        if _in_range(t, ranges.get(t["session_id"]) if ranges else None):
            by_session[t["session_id"]].append(t)
    # Fail closed: the index is built before anything is read into rows (a missing benchmark file raises).
    index = contamination.build_index(lake, cache_dir=contamination.default_cache_dir(batches_dir.parent))
    created = now_utc()
    rows, rejects = [], []
    for sid in ids:
        turns = sorted(by_session.get(sid, []), key=lambda t: (t["turn_index"], t["choice_index"] or 0))
        if not turns:
            rejects.append({"source": SOURCE, "line": None, "raw": sid, "error": f"session {sid} has no turns", "batch_id": batch_id, "stage": "tasks"})
            continue
        msgs = _messages(turns[0]["messages"])
        prompt = _first_user_message(msgs)
        meta = {"session_id": sid, "tenant": turns[0]["tenant"], "family": multiturn.session_family(msgs),
                "turns": len({t["turn_index"] for t in turns}), "policy_versions": sorted({t["policy_version"] or "" for t in turns})}
        if ranges:
            meta["turn_range"] = list(ranges[sid])
        rows.append({"batch_id": batch_id, "task_id": sid, "source": SOURCE, "environment": "chat", "prompt": prompt,
                     "reference": "", "difficulty": None, "metadata": json.dumps(meta), "created_at": created})
    # A session whose first user message is a benchmark item (or a near duplicate) is not trained on. The
    # quarantine keeps the session id and the match, not the message (sessions may hold private text).
    rows, dirty = contamination.screen_tasks(index, rows)
    for row, match in dirty:
        rejects.append({"source": SOURCE, "line": None, "raw": json.dumps({"session_id": row["task_id"], "contamination": match.as_dict()}),
                        "batch_id": batch_id, "stage": "tasks",
                        "error": f"session {row['task_id']} asks the benchmark item {match.describe()}: "
                                 "training on it would contaminate the evaluation"})
    n_bad = lake.quarantine(rejects, batch_id=batch_id, stage="tasks")
    if not rows:
        raise ValueError(f"sessions batch {batch_id!r} has no trainable session ({n_bad} quarantined)")
    n = lake.write_batch("tasks", batch_id, rows)
    return n, {"num_tasks": n, "sessions": len(ids), "quarantined_sessions": n_bad,
               "continuations": sum(1 for sid in ids if ranges and ranges[sid][0] > 0)}


def _in_range(turn: dict, turn_range: tuple[int, int] | list[int] | None) -> bool:
    return turn_range is None or turn_range[0] <= int(turn["turn_index"]) <= turn_range[1]


def task_turn_ranges(lake: Lakehouse, batch_id: str) -> dict[str, tuple[int, int] | None]:
    """session id -> the (first, last) turn index its task holds (None: every turn), from the tasks."""
    out: dict[str, tuple[int, int] | None] = {}
    for t in lake.read("tasks", batch_id=batch_id, columns=["task_id", "metadata"]).to_pylist():
        r = json.loads(t["metadata"] or "{}").get("turn_range")
        out[t["task_id"]] = (int(r[0]), int(r[1])) if r else None
    return out


def _assistant_text(response: str | None) -> str:
    try:
        msg = json.loads(response or "{}")
    except ValueError:
        return response or ""
    if not isinstance(msg, dict):
        return str(msg)
    text = msg.get("content") or ""
    for call in msg.get("tool_calls") or []:
        fn = (call or {}).get("function") or {}
        text += f"\n[tool_call {fn.get('name')}({fn.get('arguments')})]"
    return text


def rollout_id(batch_id: str, session_id: str, segment: int) -> str:
    return "s-" + hashlib.sha1(f"{batch_id}\x1f{session_id}\x1f{segment}".encode()).hexdigest()[:16]


def build_session_rollouts(lake: Lakehouse, batch_id: str) -> tuple[int, dict[str, Any]]:
    """One rollout per session segment, built from the turns (nothing is generated)."""
    ranges = task_turn_ranges(lake, batch_id)
    tasks = list(ranges)
    by_session: dict[str, list[dict]] = defaultdict(list)
    for t in _read_turns(lake, tasks):
        if _in_range(t, ranges[t["session_id"]]):  # a continuation: only the turns after the last cut
            by_session[t["session_id"]].append(t)
    created = now_utc()
    rows, skipped = [], []
    for sid in tasks:
        turns = by_session.get(sid, [])
        segments = multiturn.build_segments(sid, turns)
        if not segments:
            skipped.append(sid)
            continue
        by_id = {t["turn_id"]: t for t in turns}
        for seg in segments:
            seg_turns = [by_id[s.turn_id] for s in seg.spans]
            first = seg_turns[0]
            msgs = _messages(first["messages"])
            rows.append({
                "batch_id": batch_id, "rollout_id": rollout_id(batch_id, sid, seg.segment), "task_id": sid,
                "group_index": seg.segment, "policy_version": seg.policy_version, "backend": first.get("backend") or "gateway",
                "model": first.get("model") or "", "prompt_text": "\n".join(f"{m.get('role')}: {m.get('content')}" for m in msgs if isinstance(m, dict)),
                "completion": "\n".join(_assistant_text(t.get("response")) for t in seg_turns), "steps": [], "answer": None,
                "parse_mode": "session", "prompt_tokens": len(seg.prompt_ids), "completion_tokens": len(seg.completion_ids),
                "completion_token_ids": seg.completion_ids, "sampling_logprobs": seg.old_logps,
                "finish_reason": seg_turns[-1].get("finish_reason") or "stop", "temperature": seg.temperature,
                "seconds": sum((t.get("latency_ms") or 0.0) for t in seg_turns) / 1000.0, "created_at": created,
                "session_id": sid, "prompt_token_ids": seg.prompt_ids, "assistant_mask": seg.assistant_mask,
                "turn_spans": [{"turn_id": s.turn_id, "turn_index": s.turn_index, "start": s.start, "end": s.end} for s in seg.spans],
            })
    n = lake.write_batch("rollouts", batch_id, rows)
    return n, {"num_rollouts": n, "sessions": len(tasks) - len(skipped), "skipped_sessions": ", ".join(skipped) or None,
               "segments_per_session": round(n / max(1, len(tasks) - len(skipped)), 3),
               "policy_version": ", ".join(sorted({r["policy_version"] for r in rows})),
               "assistant_tokens": sum(sum(r["assistant_mask"]) for r in rows),
               "context_tokens": sum(len(r["assistant_mask"]) - sum(r["assistant_mask"]) for r in rows)}


def segment_user_texts(lake: Lakehouse, rollouts: list[dict]) -> dict[str, str]:
    """Per segment rollout, the last user message of its first turn's messages (the prompt its tokens
    start from; "" when that call had none): where a hint goes in the teacher's context."""
    first = {ro["rollout_id"]: (ro["turn_spans"] or [{}])[0].get("turn_id") for ro in rollouts}
    sids = sorted({ro["session_id"] or ro["task_id"] for ro in rollouts})
    messages = {t["turn_id"]: _messages(t["messages"]) for t in _read_turns(lake, sids, columns=["turn_id", "messages"])}
    out = {}
    for rid, turn_id in first.items():
        users = [m for m in messages.get(turn_id, []) if isinstance(m, dict) and m.get("role") == "user" and isinstance(m.get("content"), str)]
        out[rid] = users[-1]["content"] if users else ""
    return out


def _message_text(m: dict) -> str:
    content = m.get("content")
    text = content if isinstance(content, str) else (json.dumps(content) if content is not None else "")
    for call in m.get("tool_calls") or []:
        fn = (call or {}).get("function") or {}
        text += f"\n[tool_call {fn.get('name')}({fn.get('arguments')})]"
    return text.strip()


def session_transcript(turns: list[dict]) -> str:
    """The whole session as the judge reads it: the last call's messages (the client sends the history)
    and its reply, one ``role: text`` block each (tool calls and tool results included)."""
    last = max(turns, key=lambda t: (t["turn_index"], -(t.get("choice_index") or 0)))
    msgs = [m for m in _messages(last.get("messages")) if isinstance(m, dict)]
    try:
        reply = json.loads(last.get("response") or "{}")
    except ValueError:
        reply = {"role": "assistant", "content": last.get("response")}
    if isinstance(reply, dict):
        msgs.append({"role": "assistant", **reply})
    blocks = []
    for m in msgs:
        role = str(m.get("role") or "?")
        if role == "tool":
            role = f"tool result ({m.get('name') or m.get('tool_call_id') or 'tool'})"
        blocks.append(f"{role}: {_message_text(m)}")
    return "\n\n".join(blocks)


def build_session_reviews(lake: Lakehouse, batch_id: str, *, judge: LLMManager | Callable[[], LLMManager] | None = None,
                          no_judge_reason: str = "no judge configured") -> tuple[int, dict[str, Any]]:
    """The live reviews of the batch's sessions, copied into the batch (targets kept: turn or session ids).

    A session that no person reviewed (no review of it or of any of its turns) is reviewed by ``judge``
    (the llm manager, or a function that builds it: the model is loaded only when a session needs it):
    one session-level row with ``manager = 'judge'`` and ``reviewer`` = the judge model, which the
    trajectories use exactly like a person's session review. A person's review always wins: the judge
    never sees a reviewed session. Without a judge (``no_judge_reason`` says why), or when the judge's
    reply has no score (its reply goes to ``quarantine``), the session gets no review and its turns are not
    trained on; the metadata names those sessions."""
    ranges = task_turn_ranges(lake, batch_id)
    sessions = set(ranges)
    every = _read_turns(lake, sorted(sessions), columns=["turn_id", "session_id", "tenant", "turn_index", "choice_index", "messages",
                                                         "response", "created_at"])
    turn_sessions = {t["turn_id"]: t["session_id"] for t in every}
    turn_index = {t["turn_id"]: int(t["turn_index"]) for t in every}
    turns = [t for t in every if _in_range(t, ranges[t["session_id"]])]
    rows = []
    for sid, reviews in review_session_ids(live_reviews(lake), turn_sessions).items():
        if sid not in sessions:
            continue
        if ranges[sid] is not None:  # the reviews of the turns this batch holds (a continuation: made after its first turn)
            first, last = ranges[sid]
            first_at = min((t["created_at"] for t in turns if t["session_id"] == sid and t["created_at"] is not None), default=None)
            reviews = reviews_of_turns(sid, reviews, turn_index, first, last, first_at)
        for r in reviews:
            rows.append({**{k: r.get(k) for k in ("rollout_id", "manager", "score", "critique", "hint", "created_at", "review_id",
                                                  "reviewer", "rubric", "tenant")},
                         "batch_id": batch_id, "session_id": sid, "manager": r.get("manager") or "live"})
    reviewed = {r["session_id"] for r in rows}
    unreviewed = sorted(sessions - reviewed)
    judged: list[str] = []
    judge_name: str | None = None
    if unreviewed and judge is not None:
        manager = judge() if callable(judge) else judge
        judge_name = str(getattr(manager.backend, "model_name", None) or "llm")
        by_session: dict[str, list[dict]] = defaultdict(list)
        for t in turns:
            by_session[t["session_id"]].append(t)
        todo = [sid for sid in unreviewed if by_session.get(sid)]
        created = now_utc()
        rejects = []
        for sid, (review, raw) in zip(todo, manager.review_sessions([session_transcript(by_session[sid]) for sid in todo])):
            if review is None:
                rejects.append({"source": "judge", "line": None, "raw": raw[:2000], "batch_id": batch_id, "stage": "reviews",
                                "error": f"the judge ({judge_name}) gave session {sid} no score in 0-10: the session is not trained on"})
                continue
            judged.append(sid)
            rows.append({"batch_id": batch_id, "rollout_id": sid, "manager": multiturn.JUDGE_MANAGER, "score": float(review.score),
                         "critique": review.critique, "hint": review.hint, "created_at": created,
                         "review_id": "judge-" + hashlib.sha1(f"{batch_id}\x1f{sid}".encode()).hexdigest()[:16],
                         "session_id": sid, "reviewer": judge_name, "rubric": "session-judge",
                         "tenant": by_session[sid][0].get("tenant")})
        lake.quarantine(rejects, batch_id=batch_id, stage="reviews")
    skipped = [sid for sid in unreviewed if sid not in judged]
    n = lake.write_batch("reviews", batch_id, rows)
    turn_level = sum(r["rollout_id"] in turn_sessions for r in rows)
    if judge is None:
        why = f"no judge ({no_judge_reason})"
    elif judge_name is None:
        why = "every session has a person's review: the judge was not needed"
    else:
        why = f"the judge {judge_name} gave no score (its replies are in quarantine)"
    return n, {"num_reviews": n, "turn_reviews": turn_level, "session_reviews": n - turn_level,
               "reviewed_sessions": len(reviewed), "sessions": len(sessions),
               "judge": judge_name or (f"none: {no_judge_reason}" if judge is None else "not needed"),
               "judged_sessions": len(judged),
               "unreviewed_skipped": ", ".join(skipped) or None,
               "unreviewed_skipped_reason": why if skipped else None}


def build_session_trajectories(lake: Lakehouse, batch_id: str, *, scale_rewards: str = "group",
                               dynamic_sampling: bool = False, w_rl: float = 1.0, w_opd: float = 0.0) -> tuple[int, dict[str, Any]]:
    """Multi-turn trajectories: each rewarded assistant turn's reward, normalised per family group or
    against the batch (``training/multiturn.py``), spread over its tokens; segments without any
    rewarded turn are skipped and reported.

    With ``w_opd > 0`` a segment whose hint the teacher used carries ``opd_signal`` (from
    ``teacher_logprobs``, 0 on context tokens) and the weights; the trainer's sample
    (``training/samples.py``: ``multi_turn_sample``) trains ``w_rl * A_turn + w_opd * opd`` on its trained
    tokens. With ``w_rl == 0`` only such segments are kept."""
    opd_signals = {}
    if w_opd > 0 and lake.exists("teacher_logprobs"):
        opd_signals = {r["rollout_id"]: r["opd_signal"] for r in lake.read("teacher_logprobs", batch_id=batch_id).to_pylist()
                       if r["decision"] == "used"}
    tasks = {t["task_id"]: json.loads(t["metadata"] or "{}") for t in lake.read("tasks", batch_id=batch_id).to_pylist()}
    reviews = defaultdict(list)
    for r in lake.read("reviews", batch_id=batch_id).to_pylist():
        reviews[r["session_id"]].append(r)
    rollouts = sorted(lake.read("rollouts", batch_id=batch_id).to_pylist(), key=lambda r: (r["task_id"], r["group_index"]))
    items, per_rollout, skipped = [], {}, []
    for ro in rollouts:
        sid = ro["session_id"] or ro["task_id"]
        spans = ro["turn_spans"] or []
        rewards = multiturn.turn_rewards(sid, [s["turn_id"] for s in spans], reviews.get(sid, []))
        if not rewards:
            skipped.append(sid)
            continue
        per_rollout[ro["rollout_id"]] = rewards
        family = tasks.get(ro["task_id"], {}).get("family") or sid
        items += [(family, sid, s["turn_id"], rewards[s["turn_id"]][0], rewards[s["turn_id"]][1]) for s in spans if s["turn_id"] in rewards]
    adv = multiturn.turn_advantages(items, scale_rewards=scale_rewards)
    weights = DEFAULT_WEIGHTS["chat"]
    created = now_utc()
    rows = []
    for ro in rollouts:
        if ro["rollout_id"] not in per_rollout:
            continue
        spans = ro["turn_spans"] or []
        rewarded = [s for s in spans if s["turn_id"] in adv]
        turn_adv = {s["turn_id"]: adv[s["turn_id"]].advantage for s in rewarded}
        mask, token_adv = multiturn.segment_token_arrays(len(ro["completion_token_ids"]), spans, turn_adv)
        scores = [adv[s["turn_id"]].reward for s in rewarded]
        manager = sum(scores) / len(scores)
        rows.append({
            "batch_id": batch_id, "rollout_id": ro["rollout_id"], "task_id": ro["task_id"], "group_index": ro["group_index"],
            "policy_version": ro["policy_version"], "outcome_reward": 0.0, "format_reward": 0.0, "process_reward": None,
            "step_rewards": [], "manager_score": manager, "overlong_penalty": 0.0,
            "reward": combine(weights, outcome=0.0, format=0.0, process=None, manager=manager), "reward_weights": weights.to_json(),
            "advantage": sum(turn_adv.values()) / len(turn_adv), "step_advantages": [], "advantage_mode": "turn",
            "kept": opd.keeps(any(adv[s["turn_id"]].signal for s in rewarded) if dynamic_sampling else True,
                              opd_signals.get(ro["rollout_id"]), w_rl=w_rl, w_opd=w_opd),
            "created_at": created, "opd_signal": opd_signals.get(ro["rollout_id"]), "w_rl": float(w_rl), "w_opd": float(w_opd),
            "kind": "multi_turn", "loss_mask": mask, "token_advantages": token_adv,
            "turn_rewards": [adv[s["turn_id"]].reward if s["turn_id"] in adv else None for s in spans],
            "turn_advantages": [turn_adv.get(s["turn_id"]) for s in spans],
        })
    n = lake.write_batch("trajectories", batch_id, with_policy_lag(lake, rows))  # how stale each row is
    groups = {a.group for a in adv.values()}
    return n, {"num_trajectories": n, "kind": "multi_turn", "rewarded_turns": len(items),
               "opd_rows": sum(r["opd_signal"] is not None for r in rows), "kept": sum(r["kept"] for r in rows),
               "unrewarded_turns": sum(len(r["turn_spans"] or []) for r in rollouts if r["rollout_id"] in per_rollout) - len(items),
               "judged_turns": sum(source == "judge" for *_, source in items),
               "skipped_sessions": ", ".join(sorted(set(skipped))) or None,
               "groups": len(groups), "family_groups": len(groups - {"batch"}),
               "reward_mean": round(sum(r["reward"] for r in rows) / max(n, 1), 4)}
