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
All or nothing (:func:`import_file`): every trajectory of the file is validated (Unicode text, token ids
inside the policy's vocabulary, rows the tables can hold) before anything lands, the bad ones named and
kept in ``quarantine``; then one Delta commit per table lands them all. Re-importing the same content
changes nothing; changed content for a session already landed is refused unless ``replace``.
"""

from __future__ import annotations

import hashlib
import json
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from tentalis_pipelines.envs import atif
from tentalis_pipelines.envs.base import Episode
from tentalis_pipelines.envs.runner import episode_to_turns
from tentalis_pipelines.gateway import landing
from tentalis_pipelines.lakehouse import Lakehouse, LakehouseError, to_table

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
                 "check_kind": record.get("check_kind"), "batch_id": batch_id, "group_index": first["group_index"],
                 "tools": record.get("tools")}  # the known solution's tools, which the verdict's hint names
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
    from tentalis_pipelines.stages.kinds import ENVIRONMENT, SESSIONS, batch_kind

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
    from tentalis_pipelines.envs.verdicts import VERIFIER, verdict_review

    extra = atif.tentalis_extra(doc)
    fields = verdict_review(passed=episode.verdict.passed, reward=episode.verdict.reward, detail=episode.verdict.detail,
                            end_reason=episode.end_reason, check_kind=str(extra.get("check_kind") or "answer"),
                            format_errors=sum(1 for t in episode.turns if t.action is None), turns=episode.turns_used,
                            max_turns=episode.max_turns, tools=[str(t) for t in extra.get("tools") or []])
    sid = doc["session_id"]
    return landing.review_row(tenant=tenant, session_id=sid, turn_id=None, score=fields["score"], critique=fields["critique"],
                              hint=fields["hint"], reviewer=VERIFIER, rubric=f"{episode.environment}-final-state",
                              review_id=_review_id(tenant, sid))


def episode_rows(doc: dict[str, Any], *, tenant: str = DEFAULT_TENANT, now: datetime | None = None,
                 vocab_size: int | None = None) -> tuple[list[dict], dict, dict | None]:
    """(turn rows, session metadata, review row or None) that one trajectory lands as (validated first,
    token ids against ``vocab_size`` when given)."""
    episode = atif.atif_to_episode(doc, vocab_size=vocab_size)
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


@dataclass
class _Plan:
    """What one trajectory lands as: its turn rows, the session's metadata (JSON), its review (or None),
    and which of its turns the trajectory stamped (the others take the import's time, so a re-import
    does not compare it)."""

    index: int
    sid: str
    rows: list[dict[str, Any]]
    metadata: str
    review: dict[str, Any] | None
    stamped: set[str]


# Compared on a re-import: what the rows say, not when the import ran (created_at is compared only where
# the trajectory stamped the turn).
TURN_COMPARE = [c for c in to_table("turns", []).column_names if c != "created_at"]


def _plan(doc: Any, k: int, *, tenant: str, vocab_size: int | None, now: datetime) -> _Plan:
    """The trajectory's rows, checked against the tables' schemas too, so that nothing can fail once
    the writes begin (:class:`~tentalis_pipelines.envs.atif.ATIFError` otherwise)."""
    try:
        rows, metadata, review = episode_rows(doc, tenant=tenant, now=now, vocab_size=vocab_size)
    except atif.ATIFError:
        raise
    except Exception as exc:  # noqa: BLE001 - a case the validator missed: name it, and still land nothing
        raise atif.ATIFError(f"could not be read ({type(exc).__name__}: {exc}); fix the field it names") from None
    try:
        to_table("turns", rows)
        if review is not None:
            to_table("reviews", [review])
        text = landing.dumps(metadata)
        text.encode("utf-8")
    except (LakehouseError, UnicodeEncodeError, ValueError, TypeError) as exc:
        raise atif.ATIFError(f"does not fit the lakehouse's tables: {exc}; fix the field it names") from None
    stamps = atif.step_timestamps(doc)
    stamped = {r["turn_id"] for r, st in zip(rows, stamps) if st}
    return _Plan(k, doc["session_id"], rows, text, review, stamped)


def _has_token_ids(doc: Any) -> bool:
    steps = doc.get("steps") if isinstance(doc, dict) else None
    return any(isinstance(s, dict) and isinstance(s.get("metrics"), dict)
               and (s["metrics"].get("prompt_token_ids") or s["metrics"].get("completion_token_ids"))
               for s in steps or [])


def _episode_meta(text: str | None) -> dict[str, Any] | None:
    """The part of a session's metadata a re-import compares: the transcript and the extra details
    (not the agent's version: a newer export of the same episode names a newer Tentalis)."""
    if not text:
        return None
    ep = (json.loads(text) or {}).get("episode") or {}
    return {"transcript": ep.get("transcript"), "extra": ep.get("extra")}


def _differences(p: _Plan, old_turns: list[dict], old_meta: str | None, old_review: dict | None) -> list[str]:
    """What the lakehouse holds for the session that this trajectory would change (empty: the same, or
    not landed yet). Rows are compared as the tables store them (log-probs as float32)."""
    what = []
    if old_turns:
        new = {r["turn_id"]: r for r in to_table("turns", p.rows).to_pylist()}
        old = {r["turn_id"]: r for r in old_turns}
        if set(new) != set(old):
            what.append(f"turns ({len(old)} landed, {len(new)} in the file)")
        else:
            cols = [c for c in TURN_COMPARE if c != "turn_id"]
            bad = sorted(t for t in new if any(new[t][c] != old[t][c] for c in cols)
                         or (t in p.stamped and new[t]["created_at"] != old[t]["created_at"]))
            if bad:
                what.append(f"turn(s) {', '.join(bad[:3])}")
    if old_meta is not None and _episode_meta(old_meta) not in (None, _episode_meta(p.metadata)):
        what.append("transcript")
    if old_review is not None:
        if p.review is None:
            what.append("verdict (landed, none in the file)")
        elif any(old_review.get(c) != p.review[c] for c in landing.REVIEW_COMPARE):
            what.append("verdict")
    return what


def import_episodes(lake: Lakehouse, docs: list[dict[str, Any]], *, tenant: str = DEFAULT_TENANT,
                    vocab_size: int | None = None, replace: bool = False) -> dict[str, int]:
    """Land trajectories as live sessions (see the module doc), all or nothing.

    Every trajectory is checked before anything lands: :class:`~tentalis_pipelines.envs.atif.ATIFError`
    names every bad one (a bad field, text that is not Unicode, a token id outside ``[0, vocab_size)``,
    a row the tables cannot hold), :class:`ImportRefused` a session id used twice in the input, or already
    in the lakehouse for another tenant, or with other content (turns, transcript or verdict) unless
    ``replace``, which replaces those sessions' turns, metadata and review with the file's. A session
    landed with the same content is left alone (re-importing a file changes nothing), one landed in part
    (an import that died between its commits) is completed. The writes are one commit per table (two
    for ``turns`` when replacing), whatever the number of trajectories. Returns counts: trajectories,
    sessions landed, replaced, unchanged, skipped (no policy turn: nothing to land), turns, reviews."""
    planned = plan_import(docs, tenant=tenant, vocab_size=vocab_size)
    return land_plans(lake, planned, n_docs=len(docs), tenant=tenant, replace=replace)


def plan_import(docs: list[Any], *, tenant: str = DEFAULT_TENANT, vocab_size: int | None = None,
                labels: list[str] | None = None) -> list[_Plan]:
    """Check every trajectory and build its rows (nothing is written): :class:`ATIFError` names every bad
    one (``labels``: how to name each, default ``trajectory <k>``), :class:`ImportRefused` a duplicate id."""
    if not tenant or not tenant.strip():
        raise ImportRefused("the tenant must not be empty")
    now = datetime.now(timezone.utc)
    planned, seen, problems = [], {}, []
    for k, doc in enumerate(docs):
        label = labels[k] if labels else f"trajectory {k}"
        try:
            p = _plan(doc, k, tenant=tenant, vocab_size=vocab_size, now=now)
        except atif.ATIFError as exc:
            problems.append((k, f"{label}: {exc}"))
            continue
        if p.sid in seen:
            raise ImportRefused(f"{label} and {seen[p.sid]} share session_id {p.sid!r}: each episode needs its own")
        seen[p.sid] = label
        if p.rows:  # an episode that failed before its first turn has nothing to land (or to train on)
            planned.append(p)
    if problems:
        raise PlanErrors(problems)
    return planned


class PlanErrors(atif.ATIFError):
    """Every bad trajectory of an import (``problems``: (index, message) pairs); nothing landed."""

    def __init__(self, problems: list[tuple[int, str]]):
        self.problems = problems
        shown = [m for _, m in problems[:10]]
        more = f"\n... and {len(problems) - 10} more bad trajectories" if len(problems) > 10 else ""
        super().__init__("\n".join(shown) + more)


def land_plans(lake: Lakehouse, planned: list[_Plan], *, n_docs: int, tenant: str, replace: bool = False) -> dict[str, int]:
    """Land checked trajectories (:func:`plan_import`): see :func:`import_episodes`."""
    ids = [p.sid for p in planned]
    sessions = {r["session_id"]: r for r in landing.select(lake, "sessions", ["tenant", "metadata"], "session_id", ids)}
    old_turns: dict[str, list[dict]] = defaultdict(list)
    for t in landing.select(lake, "turns", TURN_COMPARE + ["created_at"], "session_id", ids):
        old_turns[t["session_id"]].append(t)
    review_ids = [p.review["review_id"] for p in planned if p.review] + [_review_id(tenant, p.sid) for p in planned if not p.review]
    old_reviews = {r["review_id"]: r for r in landing.select(lake, "reviews", [*landing.REVIEW_COMPARE, "batch_id", "tenant"],
                                                             "review_id", review_ids) if r["batch_id"] == landing.LIVE_BATCH}
    fresh, replaced, changed, unchanged = [], [], [], 0
    for p in planned:
        owner = sessions.get(p.sid, {}).get("tenant") or next((t["tenant"] for t in old_turns.get(p.sid, [])), None)
        rid = p.review["review_id"] if p.review else _review_id(tenant, p.sid)
        if (owner is not None and owner != tenant) or (rid in old_reviews and old_reviews[rid]["tenant"] != tenant):
            raise ImportRefused(f"session {p.sid!r} already exists for another tenant: import it under that tenant "
                                "or give the trajectory another session_id")
        what = _differences(p, old_turns.get(p.sid, []), sessions.get(p.sid, {}).get("metadata"), old_reviews.get(rid))
        if what:
            (replaced if replace else changed).append((p, what))
        elif old_turns.get(p.sid) and p.sid in sessions and (p.review is None or rid in old_reviews):
            unchanged += 1  # landed whole before: nothing to write
        else:
            fresh.append(p)  # new, or landed in part by an import that died between its commits
    if changed:
        listed = "; ".join(f"{p.sid!r} ({', '.join(what)})" for p, what in changed[:5])
        more = f" and {len(changed) - 5} more" if len(changed) > 5 else ""
        raise ImportRefused(f"session(s) {listed}{more} already exist with other content; a changed re-import is refused "
                            "so that nothing landed is overwritten silently: give the trajectories other session_ids, or "
                            "import with --replace (replace=True) to replace those sessions' turns, transcript and review")
    turns_written = 0
    if replaced:  # one commit: the sessions' old turns out, the file's in (none of another session is touched)
        rep = [p for p, _ in replaced]
        turns_written += lake.replace_in("turns", "session_id", [p.sid for p in rep], [r for p in rep for r in p.rows])
    landing_now = fresh + [p for p, _ in replaced]
    records = [{"kind": "turn", "row": r, "session_metadata": p.metadata} for p in landing_now for r in p.rows]
    landed = landing.land_records(lake, records) if records else {"turns": 0}  # turns: one append; sessions: one replace
    turns_written += landed["turns"]
    # A fresh session's review may have landed already (an import that died after the reviews' commit):
    # _differences found it the same, so it is not written again.
    reviews = ([p.review for p in fresh if p.review is not None and p.review["review_id"] not in old_reviews]
               + [p.review for p, _ in replaced if p.review is not None])
    dropped = [_review_id(tenant, p.sid) for p, _ in replaced if p.review is None and _review_id(tenant, p.sid) in old_reviews]
    if reviews or dropped:  # one commit for every review of the import
        lake.replace_in("reviews", "review_id", [r["review_id"] for r in reviews] + dropped, reviews,
                        where={"batch_id": landing.LIVE_BATCH})
    return {"trajectories": n_docs, "sessions": len(fresh), "replaced": len(replaced), "unchanged": unchanged,
            "skipped": n_docs - len(planned), "turns": turns_written, "reviews": len(reviews)}


def _review_id(tenant: str, sid: str) -> str:
    return "verdict-" + hashlib.sha256(f"{tenant}\x1f{sid}".encode()).hexdigest()[:24]


QUARANTINE_STAGE = "episodes-import"


def import_file(lake: Lakehouse, path: Path | str, *, tenant: str = DEFAULT_TENANT,
                vocab_size: int | Callable[[], int] | None = None, replace: bool = False) -> dict[str, int]:
    """Import an ATIF file (``.json`` or ``.jsonl``) all or nothing. Every trajectory is read and checked
    first; when any is bad, each bad one is kept in ``quarantine`` (``source`` = the file, ``line``, the
    raw text and the error, secrets redacted, ``stage = 'episodes-import'``) and
    :class:`~tentalis_pipelines.envs.atif.ATIFError` names them all (file, line or item, trajectory
    index, field, fix): nothing lands in ``turns``, ``sessions`` or ``reviews``. ``vocab_size``: the
    policy's vocabulary (or a function giving it, called only when a trajectory carries token ids)."""
    from tentalis_pipelines.redact import redact

    path = Path(path)
    entries = atif.read_entries(path)
    if not entries:
        raise atif.ATIFError(f"{path.name}: holds no trajectory (an empty file): nothing to import")
    parsed = [e for e in entries if e.error is None]
    if callable(vocab_size):
        vocab_size = vocab_size() if any(_has_token_ids(e.doc) for e in parsed) else None
    problems: list[tuple[int, str]] = [(e.index, f"{e.error} (trajectory {e.index})") for e in entries if e.error is not None]
    planned: list[_Plan] = []
    try:
        planned = plan_import([e.doc for e in parsed], tenant=tenant, vocab_size=vocab_size,
                              labels=[f"{e.where} (trajectory {e.index})" for e in parsed])
    except PlanErrors as exc:
        problems += [(parsed[k].index, msg) for k, msg in exc.problems]
    if problems:
        problems.sort()
        lake.quarantine([{"source": str(path), "line": entries[k].line, "raw": redact(entries[k].raw)[:10_000],
                          "error": redact(msg), "batch_id": None, "stage": QUARANTINE_STAGE} for k, msg in problems])
        raise PlanErrors(problems)
    return land_plans(lake, planned, n_docs=len(entries), tenant=tenant, replace=replace)


def tokenizer_vocab_size(model: str, models_dir: Path) -> int:
    """The size of the vocabulary of ``model``'s tokenizer (``embedded`` or a local folder): the token ids
    an imported trajectory may hold, if the policy is to train on them."""
    from transformers import AutoTokenizer

    from tentalis_pipelines.inference.models import resolve_model

    return len(AutoTokenizer.from_pretrained(resolve_model(model, models_dir)))
