"""The `grounding_flags` stage: claims of agent turns that their session's tool outputs do not support.

Reads the batch's rollouts (agent work: sessions batches and environment batches, whose rollouts carry
``turn_spans``) and each turn's context: for a live session, the messages of that turn's call (system,
user and tool messages; the assistant's own earlier words are no evidence); for an environment
episode, the transcript's messages before that assistant turn. Each turn's text is its completion
tokens decoded, so every flag maps back to exact tokens (``training/grounding_policy.py``). Single-turn
task rollouts have no tool output and are not checked (counted in the metadata).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from tentalis_pipelines.gateway import landing
from tentalis_pipelines.lakehouse import Lakehouse, now_utc
from tentalis_pipelines.reviewers.grounding import Evidence, Flag, check_answer, validate_flag
from tentalis_pipelines.stages.common import StageResult
from tentalis_pipelines.training.grounding_policy import chars_to_tokens, token_char_offsets

EVIDENCE_ROLES = ("system", "user", "tool", "function", "observation", "environment")


def _text(m: dict) -> str:
    content = m.get("content")
    return content if isinstance(content, str) else (json.dumps(content) if content is not None else "")


def context_of(messages: list[Any]) -> str:
    """The evidence in a list of chat messages: every non-assistant message's text, in order."""
    return "\n".join(_text(m) for m in messages if isinstance(m, dict) and str(m.get("role")) in EVIDENCE_ROLES)


def _episode_contexts(episode_json: str | None) -> dict[int, str]:
    """turn index -> context, from an environment rollout's episode record (the messages before the
    turn's assistant message)."""
    record = json.loads(episode_json or "{}")
    transcript = record.get("transcript") or {}
    messages = transcript.get("messages") or []
    turns = [int(t["index"]) for t in transcript.get("turns") or []]
    out, seen, assistant = {}, [], 0
    for m in messages:
        if isinstance(m, dict) and m.get("role") == "assistant":
            if assistant < len(turns):
                out[turns[assistant]] = context_of(seen)
            assistant += 1
        seen.append(m)
    for t in turns:  # transcripts that keep no assistant messages: every turn sees all observations
        out.setdefault(t, context_of(messages))
    return out


def _session_contexts(lake: Lakehouse, rollouts: list[dict]) -> dict[str, str]:
    """turn id -> context, from the turns table (each call's own messages)."""
    ids = sorted({r["session_id"] or r["task_id"] for r in rollouts if not r.get("episode")})
    out = {}
    for t in landing.select(lake, "turns", ["turn_id", "messages"], "session_id", ids):
        try:
            msgs = json.loads(t["messages"] or "[]")
        except ValueError:
            msgs = []
        out[t["turn_id"]] = context_of(msgs if isinstance(msgs, list) else [])
    return out


def turn_flags(tokenizer, completion_ids: list[int], start: int, end: int, context: str | Evidence,
               detect: Callable[[str, Any], list[Flag]] = check_answer) -> list[dict]:
    """The flags of one turn (tokens ``[start, end)`` of a completion) as row fields: char offsets in the
    turn's decoded text, token offsets in the completion."""
    text, offsets = token_char_offsets(tokenizer, completion_ids[start:end])
    rows = []
    for f in detect(text, context):
        validate_flag(f, text)
        ts, te = chars_to_tokens(offsets, f.start, f.end)
        rows.append({"turn_token_start": start, "turn_token_end": end, "char_start": f.start, "char_end": f.end,
                     "token_start": start + ts, "token_end": start + te, "text": f.text, "kind": f.kind, "reason": f.reason,
                     "detector": f.detector})
    return rows


def build_grounding_flags(lake: Lakehouse, batch_id: str, tokenizer, *,
                          detect: Callable[[str, Any], list[Flag]] = check_answer) -> StageResult:
    """Write the batch's ``grounding_flags`` (replacing its earlier ones). ``detect(answer, context)``:
    the rules (default) or ``grounding_tagger.detect`` with a tagger."""
    rollouts = lake.read("rollouts", batch_id=batch_id).to_pylist() if lake.exists("rollouts") else []
    agent = [r for r in rollouts if r.get("turn_spans")]
    sessions = _session_contexts(lake, agent)
    created = now_utc()
    rows, turns_checked, flagged_turns = [], 0, set()
    for ro in sorted(agent, key=lambda r: r["rollout_id"]):
        episode = _episode_contexts(ro.get("episode")) if ro.get("episode") else None
        ids = list(ro["completion_token_ids"] or [])
        for span in ro["turn_spans"]:
            context = episode.get(int(span["turn_index"]), "") if episode is not None else sessions.get(span["turn_id"], "")
            turns_checked += 1
            for f in turn_flags(tokenizer, ids, int(span["start"]), int(span["end"]), context, detect):
                rows.append({"batch_id": batch_id, "rollout_id": ro["rollout_id"], "turn_index": int(span["turn_index"]),
                             **f, "created_at": created})
                flagged_turns.add((ro["rollout_id"], int(span["turn_index"])))
    n = lake.write_batch("grounding_flags", batch_id, rows)
    kinds: dict[str, int] = {}
    for r in rows:
        kinds[r["kind"]] = kinds.get(r["kind"], 0) + 1
    return StageResult(n, {"num_flags": n, "turns_checked": turns_checked, "flagged_turns": len(flagged_turns),
                           "single_turn_rollouts_skipped": len(rollouts) - len(agent),
                           "by_kind": ", ".join(f"{k}: {v}" for k, v in sorted(kinds.items())) or None})
