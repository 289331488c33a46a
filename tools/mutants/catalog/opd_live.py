"""Planted bugs in hinted OPD on live sessions: which review's hint a segment gets
(``stages/teacher_logprobs.py``: segment_hint), which reviews judge a segment's turns and where its
hint goes (``sessions.py``: reviews_of_turns, segment_user_texts; ``training/opd.py``:
hinted_prompt_ids), and the signal a scored segment keeps (fill_signal, ``opd.has_effect``).

Guarded by tests/unit/test_opd_segments.py (pure: a character tokenizer and log-probs given by hand, no
model), which uses sessions of several segments where a longer hint belongs to another segment, a
question asked twice, continuations with session verdicts before and after them, and a non-default clip
and minimum effect.

No mutant here is equivalent."""

TL = "tentalis_pipelines/stages/teacher_logprobs.py"
SE = "tentalis_pipelines/sessions.py"
OP = "tentalis_pipelines/training/opd.py"
T = ["tests/unit/test_opd_segments.py"]

MUTANTS = [
    {"id": "opd-live-other-segments-hint", "file": TL, "find": "mine = [r for r in session_reviews if r[\"rollout_id\"] in targets]",
     "replace": "mine = list(session_reviews)", "tests": T,
     "why": "every review of the session counts for every segment: a segment is distilled with another segment's hint"},
    {"id": "opd-live-session-review-ignored", "file": TL,
     "find": "targets = {s[\"turn_id\"] for s in rollout[\"turn_spans\"] or []} | {sid}",
     "replace": "targets = {s[\"turn_id\"] for s in rollout[\"turn_spans\"] or []}", "tests": T,
     "why": "a review of the whole session counts for no segment"},
    {"id": "opd-live-shortest-hint", "file": TL, "find": "(decision, reason), review = max(usable,", "replace": "(decision, reason), review = min(usable,",
     "tests": T, "why": "the shortest usable hint is kept, not the longest"},
    {"id": "opd-live-trivial-as-no-hint", "file": TL, "find": "((d, r) for d, r in screened if d[0] == opd.TRIVIAL), None)",
     "replace": "((d, r) for d, r in screened if d[0] == opd.NO_HINT), None)", "tests": T,
     "why": "a segment whose only hints are trivial is reported as having none"},
    {"id": "opd-live-last-turn-excluded", "file": SE, "find": "if first <= turn_index[target] <= last:",
     "replace": "if first <= turn_index[target] < last:", "tests": T,
     "why": "the review of a segment's last turn is not the segment's (off by one)"},
    {"id": "opd-live-earlier-session-verdict", "file": SE, "find": "and r[\"created_at\"] >= first_at):",
     "replace": "and r[\"created_at\"] <= first_at):", "tests": T,
     "why": "a continuation takes the session verdicts made before its turns existed, not after"},
    {"id": "opd-live-first-user-message", "file": SE, "find": "out[rid] = users[-1][\"content\"] if users else \"\"",
     "replace": "out[rid] = users[0][\"content\"] if users else \"\"", "tests": T,
     "why": "the hint goes after the first user message of the turn, not the last"},
    {"id": "opd-live-last-turns-messages", "file": SE, "find": "first = {ro[\"rollout_id\"]: (ro[\"turn_spans\"] or [{}])[0].get(\"turn_id\")",
     "replace": "first = {ro[\"rollout_id\"]: (ro[\"turn_spans\"] or [{}])[-1].get(\"turn_id\")", "tests": T,
     "why": "the user text is taken from the segment's last turn, whose messages the segment's prompt does not end with"},
    {"id": "opd-live-first-occurrence", "file": OP, "find": "at = text.rfind(user_text) if user_text else -1",
     "replace": "at = text.find(user_text) if user_text else -1", "tests": T,
     "why": "the hint goes after the first occurrence of the user's text (a repeated question puts it in the history)"},
    {"id": "opd-live-boundary-late", "file": OP, "find": "        if len(decode(mid)) >= end:\n", "replace": "        if len(decode(mid)) > end:\n",
     "tests": T, "why": "the hint's token boundary one token late: it splits what follows the user's text"},
    {"id": "opd-live-mask-dropped", "file": TL, "find": "signal = opd.opd_signal(teacher, student, clip=config.opd_clip, mask=item.completion_mask)",
     "replace": "signal = opd.opd_signal(teacher, student, clip=config.opd_clip)", "tests": T,
     "why": "tool outputs and later user messages get an OPD signal as if the assistant wrote them"},
    {"id": "opd-live-clip-default", "file": TL, "find": "signal = opd.opd_signal(teacher, student, clip=config.opd_clip, mask=item.completion_mask)",
     "replace": "signal = opd.opd_signal(teacher, student, mask=item.completion_mask)", "tests": T,
     "why": "the configured clip is ignored (the default 1.0 used)"},
    {"id": "opd-live-min-effect-default", "file": TL, "find": "if not opd.has_effect(signal, config.opd_min_effect):",
     "replace": "if not opd.has_effect(signal, 0.0):", "tests": T,
     "why": "the configured minimum effect is ignored: hints that change nothing are distilled"},
    {"id": "opd-live-effect-signed", "file": OP, "find": "return sum(abs(x) for x in signal) / len(signal) >= min_effect",
     "replace": "return sum(x for x in signal) / len(signal) >= min_effect", "tests": T,
     "why": "the signed mean: a hint that raises some tokens and lowers others as much counts as no effect"},
]
