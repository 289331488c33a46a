"""Planted bugs in the gateway's landing: what a turn records of the settings it was answered with
(``gateway/app.py``'s turn_row, ``gateway/upstream.py``'s forward) and how turns, sessions and live
reviews land (``gateway/landing.py``).

Guarded by tests/unit/test_gateway_landing.py (pure: the gateway in-process with the upstream replaced by
a function, no model, no server), which sends non-default sampling settings (temperature 0.3 and 1.4,
max_completion_tokens over max_tokens, n = 2, a stream) and lands sessions with several choices, policies
and landings.

No mutant here is equivalent."""

A = "tentalis_pipelines/gateway/app.py"
U = "tentalis_pipelines/gateway/upstream.py"
G = "tentalis_pipelines/gateway/landing.py"
T = ["tests/unit/test_gateway_landing.py"]

MUTANTS = [
    {"id": "landing-temperature-default", "file": A, "find": "\"temperature\": float(call.body.temperature),",
     "replace": "\"temperature\": 1.0,", "tests": T, "why": "every turn records temperature 1.0, whatever it was sampled at"},
    {"id": "landing-max-tokens-ignores-completion-tokens", "file": U,
     "find": "max_tokens=getattr(body, \"max_completion_tokens\", None) or body.max_tokens,", "replace": "max_tokens=body.max_tokens,",
     "tests": T, "why": "max_completion_tokens (what the upstream obeys) is not what the turn records"},
    {"id": "landing-payload-drops-defaults", "file": U,
     "find": "payload = body.model_dump(exclude_none=True,", "replace": "payload = body.model_dump(exclude_defaults=True,", "tests": T,
     "why": "settings left at their defaults are not sent: the upstream samples at its own default temperature while 1.0 is recorded"},
    {"id": "landing-stream-flag", "file": U,
     "find": "ids_of(c[\"content\"], c[\"token_ids\"]), lps, c[\"finish_reason\"] or \"stop\", stream=True))",
     "replace": "ids_of(c[\"content\"], c[\"token_ids\"]), lps, c[\"finish_reason\"] or \"stop\", stream=False))", "tests": T,
     "why": "a streamed turn lands as not streamed"},
    {"id": "landing-count-choices", "file": G, "find": "\"turn_count\": len({r[\"turn_index\"] for r in turns}),",
     "replace": "\"turn_count\": len(turns),", "tests": T, "why": "a turn with n = 2 choices counts as two turns"},
    {"id": "landing-versions-sorted", "file": G, "find": "versions = list(dict.fromkeys(r[\"policy_version\"] for r in turns))",
     "replace": "versions = sorted({r[\"policy_version\"] for r in turns})", "tests": T,
     "why": "the policies that served a session sorted by name, not in the order they served"},
    {"id": "landing-first-last-swapped", "file": G,
     "find": "\"first_turn_at\": min(r[\"created_at\"] for r in turns), \"last_turn_at\": max(",
     "replace": "\"first_turn_at\": max(r[\"created_at\"] for r in turns), \"last_turn_at\": min(", "tests": T,
     "why": "first and last turn swapped"},
    {"id": "landing-duplicate-turns", "file": G, "find": "new = [r for tid, r in turns.items() if tid not in landed]",
     "replace": "new = list(turns.values())", "tests": T, "why": "a WAL segment landed twice lands its turns twice"},
    {"id": "landing-metadata-stale", "file": G,
     "find": "\"metadata\": metadata.get(sid) or (old.get(sid) or {}).get(\"metadata\") or \"{}\",",
     "replace": "\"metadata\": (old.get(sid) or {}).get(\"metadata\") or metadata.get(sid) or \"{}\",", "tests": T,
     "why": "a session's first metadata sticks: what the client sent later never lands"},
    {"id": "landing-metadata-lost", "file": G,
     "find": "\"metadata\": metadata.get(sid) or (old.get(sid) or {}).get(\"metadata\") or \"{}\",",
     "replace": "\"metadata\": metadata.get(sid) or \"{}\",", "tests": T,
     "why": "a landing without metadata resets the session's metadata"},
    {"id": "landing-review-ignores-hint", "file": G,
     "find": "REVIEW_COMPARE = (\"score\", \"critique\", \"hint\", \"rubric\", \"manager\", \"rollout_id\")",
     "replace": "REVIEW_COMPARE = (\"score\", \"critique\", \"rubric\", \"manager\", \"rollout_id\")", "tests": T,
     "why": "a review re-sent with a new hint is taken for the same one: the old hint is distilled"},
    {"id": "landing-release-never", "file": G, "find": "if entry is not None and entry[1] == index + 1:",
     "replace": "if entry is not None and entry[1] == index:", "tests": T,
     "why": "a failed append's turn index is never given back: the session's indexes have a gap"},
]
