"""Agent episodes in and out of the lakehouse as ATIF trajectories (``tentalis episodes export|import``).

**Export** (:func:`export_batch`, :func:`export_sessions`): an environment batch's episodes are read
from its rollouts (the ``episode`` column keeps each episode's transcript, its segments the exact token
ids and sampling log-probs of every turn: a turn's prompt is the segment's prompt plus the tokens before
its span, its completion the span); a sessions batch's (or the named sessions') episodes from their
``turns`` rows, with the transcript that an import kept in the session's metadata. Each becomes one
ATIF v1.4 trajectory (``envs/atif.py``).

**Import** (:func:`import_episodes`): each trajectory lands as a live session, exactly as the gateway
lands agent work and as an environment batch lands an episode (``envs.runner.episode_to_turns``): one
``turns`` row per policy turn with its prompt and completion token ids and sampling log-probs, the
``sessions`` row (its metadata keeps the transcript, so exporting it gives the same trajectory back),
and, when the trajectory carries a verdict, the verifier's review of the session (``manager =
'verifier'``, score = the verdict's reward, critique and hint as an environment batch's review) in the
live reviews. The ``fresh_sessions`` sensor then cuts the session into a sessions batch, which trains on
it as on any session: one segment, the assistant-only mask, the review's score as every turn's reward.
Every trajectory is validated before anything lands; re-importing a file changes nothing.
"""

from __future__ import annotations

import hashlib
import json
from collections import defaultdict
from datetime import datetime, timezone
from typing import Any

from tentalis_pipelines.envs import atif
from tentalis_pipelines.envs.base import Episode
from tentalis_pipelines.envs.runner import episode_to_turns
from tentalis_pipelines.gateway import landing
from tentalis_pipelines.lakehouse import Lakehouse

DEFAULT_TENANT = "envs"
TURN_COLUMNS = ["turn_index", "choice_index", "model", "policy_version", "backend", "temperature", "max_tokens",
                "prompt_token_ids", "completion_token_ids", "sampling_logprobs", "created_at", "tenant"]
# What the root's extra.tentalis holds beyond the episode itself, and where export takes it from.
FROM_ROWS = ("policy_version", "temperature", "backend", "max_tokens")


class ExportError(ValueError):
    """What was asked for cannot be exported (the message names it and says why)."""


class ImportRefused(ValueError):
    """The trajectories cannot land (the message names the trajectory and the fix); nothing landed."""


# --------------------------------------------------------------------------- export
def _iso(ts: Any) -> str | None:
    return ts.isoformat() if isinstance(ts, datetime) else (str(ts) if ts else None)


def _episode(transcript: dict[str, Any], tokens: dict[int, tuple]) -> Episode:
    """The transcript with each turn's token ids and log-probs put back (``tokens``: turn index ->
    (prompt ids, completion ids, log-probs or None))."""
    episode = Episode.from_dict(transcript)
    for turn in episode.turns:
        if turn.index in tokens:
            turn.prompt_token_ids, turn.token_ids, turn.logprobs = tokens[turn.index]
    return episode


def segment_tokens(rows: list[dict[str, Any]]) -> dict[int, tuple]:
    """turn index -> (prompt ids, completion ids, log-probs) from an episode's segment rows: the inverse
    of ``multiturn.build_segments`` (a turn's prompt = the segment's prompt + the tokens before its span)."""
    out: dict[int, tuple] = {}
    for r in rows:
        prompt, completion, lps = list(r["prompt_token_ids"] or []), list(r["completion_token_ids"] or []), r["sampling_logprobs"]
        for s in r["turn_spans"] or []:
            start, end = int(s["start"]), int(s["end"])
            out[int(s["turn_index"])] = (prompt + completion[:start], completion[start:end],
                                         None if lps is None else [float(x) for x in lps[start:end]])
    return out


def export_environment_batch(lake: Lakehouse, batch_id: str) -> list[dict[str, Any]]:
    """The environment batch's episodes as ATIF trajectories (session id = the episode id), in id order."""
    if not lake.exists("rollouts"):
        raise ExportError(f"batch {batch_id!r} has no rollouts: run its rollouts first")
    by_episode: dict[str, list[dict]] = defaultdict(list)
    for r in lake.read("rollouts", batch_id=batch_id).to_pylist():
        by_episode[r["session_id"] or r["rollout_id"]].append(r)
    if not by_episode:
        raise ExportError(f"batch {batch_id!r} has no rollouts: run its rollouts first")
    docs = []
    for eid, rows in sorted(by_episode.items()):
        rows.sort(key=lambda r: (len(r["rollout_id"]), r["rollout_id"]))  # the episode id, then <id>-1, <id>-2, ...
        record = json.loads(rows[0]["episode"] or "{}")
        if "transcript" not in record:
            raise ExportError(f"episode {eid} of batch {batch_id!r} was landed before episodes kept their transcript: "
                              "re-materialise the batch's rollouts to export it")
        episode = _episode(record["transcript"], segment_tokens(rows))
        first = rows[0]
        extra = {"policy_version": first["policy_version"], "temperature": first["temperature"], "backend": first["backend"],
                 "check_kind": record.get("check_kind"), "batch_id": batch_id, "group_index": first["group_index"]}
        stamp = _iso(first["created_at"])
        docs.append(atif.episode_to_atif(episode, session_id=eid, model=first["model"] or None,
                                         timestamps=[stamp] * len(episode.turns), extra=_clean(extra)))
    return docs


def _clean(extra: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in extra.items() if v is not None}


def export_sessions(lake: Lakehouse, session_ids: list[str]) -> list[dict[str, Any]]:
    """Sessions that hold an episode (imported ones, whose metadata keeps the transcript) as ATIF
    trajectories, in the order given."""
    ids = list(dict.fromkeys(session_ids))
    meta = {r["session_id"]: json.loads(r["metadata"] or "{}") for r in landing.select(lake, "sessions", ["metadata"], "session_id", ids)}
    turns: dict[str, list[dict]] = defaultdict(list)
    for t in landing.select(lake, "turns", TURN_COLUMNS, "session_id", ids):
        if int(t["choice_index"] or 0) == 0:
            turns[t["session_id"]].append(t)
    docs = []
    for sid in ids:
        if sid not in meta:
            raise ExportError(f"no session {sid!r} in the lakehouse")
        episode_meta = meta[sid].get("episode")
        if not isinstance(episode_meta, dict) or "transcript" not in episode_meta:
            raise ExportError(f"session {sid!r} holds no episode transcript (only imported episodes do); nothing to export")
        rows = sorted(turns[sid], key=lambda t: t["turn_index"])
        tokens = {int(t["turn_index"]): (list(t["prompt_token_ids"]), list(t["completion_token_ids"] or []),
                                         None if t["sampling_logprobs"] is None else [float(x) for x in t["sampling_logprobs"]])
                  for t in rows if t["prompt_token_ids"]}
        episode = _episode(episode_meta["transcript"], tokens)
        extra = dict(episode_meta.get("extra") or {})
        first = rows[0] if rows else {}
        extra.update({k: first.get(k) for k in FROM_ROWS if first})
        stamps = {int(t["turn_index"]): _iso(t["created_at"]) for t in rows}
        docs.append(atif.episode_to_atif(episode, session_id=sid, model=first.get("model") or None,
                                         timestamps=[stamps.get(t.index) for t in episode.turns], extra=_clean(extra)))
    return docs


def export_batch(lake: Lakehouse, batch_id: str) -> list[dict[str, Any]]:
    """An environment batch's episodes, or a sessions batch's sessions (whole), as ATIF trajectories."""
    from tentalis_pipelines.tasks.kinds import ENVIRONMENT, SESSIONS, batch_kind

    kind = batch_kind(lake, batch_id)  # the one resolver of a batch's kind (tests/unit/test_batch_kinds.py)
    if kind is ENVIRONMENT:
        return export_environment_batch(lake, batch_id)
    if kind is SESSIONS:
        ids = sorted(lake.read("tasks", batch_id=batch_id, columns=["task_id"]).column("task_id").to_pylist())
        return export_sessions(lake, ids)
    raise ExportError(f"batch {batch_id!r} holds no episodes: give an environment batch (tentalis batch new --tasks terminal) "
                      "or a sessions batch")


# --------------------------------------------------------------------------- import
def _created(stamp: str | None, default: datetime) -> datetime:
    if not stamp:
        return default
    ts = datetime.fromisoformat(stamp)
    return ts if ts.tzinfo else ts.replace(tzinfo=timezone.utc)


def verdict_review_row(doc: dict[str, Any], episode: Episode, tenant: str) -> dict[str, Any]:
    """The verifier's verdict as the session's live review (as an environment batch reviews an episode)."""
    from tentalis_pipelines.env_batches import VERIFIER, verdict_review

    extra = atif.tentalis_extra(doc)
    fields = verdict_review(passed=episode.verdict.passed, reward=episode.verdict.reward, detail=episode.verdict.detail,
                            end_reason=episode.end_reason, check_kind=str(extra.get("check_kind") or "answer"),
                            format_errors=sum(1 for t in episode.turns if t.action is None), turns=episode.turns_used,
                            max_turns=episode.max_turns)
    sid = doc["session_id"]
    return landing.review_row(tenant=tenant, session_id=sid, turn_id=None, score=fields["score"], critique=fields["critique"],
                              hint=fields["hint"], reviewer=VERIFIER, rubric=f"{episode.environment}-final-state",
                              review_id="verdict-" + hashlib.sha256(f"{tenant}\x1f{sid}".encode()).hexdigest()[:24])


def episode_rows(doc: dict[str, Any], *, tenant: str = DEFAULT_TENANT, now: datetime | None = None) -> tuple[list[dict], dict, dict | None]:
    """(turn rows, session metadata, review row or None) that one trajectory lands as (validated first)."""
    episode = atif.atif_to_episode(doc)
    extra = atif.tentalis_extra(doc)
    sid = doc["session_id"]
    model = doc["agent"].get("model_name") or ""
    now = now or datetime.now(timezone.utc)
    temperature = extra.get("temperature")
    rows = episode_to_turns(episode, session_id=sid, tenant=tenant, model=model,
                            policy_version=str(extra.get("policy_version") or f"external:{doc['agent']['name']}"),
                            backend=str(extra.get("backend") or "atif"), temperature=float(temperature or 0.0),
                            max_tokens=extra.get("max_tokens"), created_at=now)
    for row, stamp in zip(rows, atif.step_timestamps(doc)):
        row["created_at"] = _created(stamp, now)
        if temperature is None:
            row["temperature"] = None  # the trajectory does not say (ATIF has no field for it)
        if not row["prompt_token_ids"]:
            row["sampling_logprobs"] = None
    kept = {k: v for k, v in extra.items() if k not in FROM_ROWS and k not in
            ("environment", "task_id", "end_reason", "reward", "max_turns", "verdict", "info")}
    metadata = {"episode": {"transcript": episode.transcript(), "extra": kept, "agent": doc["agent"]}}
    review = verdict_review_row(doc, episode, tenant) if atif.has_verdict(doc) else None
    return rows, metadata, review


def _same(old: list[dict], new: list[dict]) -> bool:
    key = lambda r: (r["turn_id"], list(r["prompt_token_ids"] or []), list(r["completion_token_ids"] or []))  # noqa: E731
    return sorted(map(key, old)) == sorted(map(key, new))


def import_episodes(lake: Lakehouse, docs: list[dict[str, Any]], *, tenant: str = DEFAULT_TENANT) -> dict[str, int]:
    """Land trajectories as live sessions (see the module doc). All are checked before any lands:
    :class:`~tentalis_pipelines.envs.atif.ATIFError` for a bad field, :class:`ImportRefused` for a
    session id used twice in the input or already in the lakehouse with other turns or another tenant.
    Returns counts: trajectories, sessions landed, unchanged (imported before), skipped (no policy turn:
    nothing to land), turns, reviews."""
    if not tenant or not tenant.strip():
        raise ImportRefused("the tenant must not be empty")
    planned, seen = [], {}
    for k, doc in enumerate(docs):
        try:
            rows, metadata, review = episode_rows(doc, tenant=tenant)
        except atif.ATIFError as exc:
            raise atif.ATIFError(f"trajectory {k}: {exc}") from None
        sid = doc["session_id"]
        if sid in seen:
            raise ImportRefused(f"trajectories {seen[sid]} and {k} share session_id {sid!r}: each episode needs its own")
        seen[sid] = k
        if rows:  # an episode that failed before its first turn has nothing to land (or to train on)
            planned.append((sid, rows, metadata, review))
    ids = [p[0] for p in planned]
    owners = {r["session_id"]: r["tenant"] for r in landing.select(lake, "sessions", ["tenant"], "session_id", ids)}
    existing: dict[str, list[dict]] = defaultdict(list)
    for t in landing.select(lake, "turns", ["turn_id", "prompt_token_ids", "completion_token_ids"], "session_id", ids):
        existing[t["session_id"]].append(t)
    fresh, unchanged = [], 0
    for sid, rows, metadata, review in planned:
        if sid in owners and owners[sid] != tenant:
            raise ImportRefused(f"session {sid!r} already exists for another tenant: import it under that tenant "
                                "or give the trajectory another session_id")
        if existing.get(sid):
            if not _same(existing[sid], rows):
                raise ImportRefused(f"session {sid!r} already exists with other turns: give the trajectory another session_id")
            unchanged += 1
        fresh.append((sid, rows, metadata, review))
    records = [{"kind": "turn", "row": r, "session_metadata": landing.dumps(metadata)} for _, rows, metadata, _ in fresh for r in rows]
    landed = landing.land_records(lake, records) if records else {"turns": 0}
    reviews = sum(landing.land_review(lake, review) for *_, review in fresh if review is not None)
    return {"trajectories": len(docs), "sessions": len(fresh) - unchanged, "unchanged": unchanged,
            "skipped": len(docs) - len(planned), "turns": landed["turns"], "reviews": reviews}
