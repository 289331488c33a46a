"""Hinted OPD on live sessions with several segments (issue #33): a hint belongs to the segment whose
turns it reviews (or to the whole session), never to another segment; the longest usable hint wins; it
goes after the last user message of the segment's first turn, even when that text occurs earlier too;
and the signal is clipped, masked to the assistant's tokens and dropped under a non-zero minimum effect.
No model: a character tokenizer places the hint, log-probs are given by hand. Each test names the planted
bug it was seen failing against (tools/mutants/catalog/opd_live.py)."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest

from tentalis_pipelines import sessions
from tentalis_pipelines.lakehouse import Lakehouse, now_utc
from tentalis_pipelines.stages.teacher_logprobs import fill_signal, segment_hint
from tentalis_pipelines.training import opd
from tentalis_pipelines.training.trainer import GRPOConfig

HINT_A = "Call the multiply tool before you answer."
HINT_B = "Add the tool's result to the follow-up number, then answer with it."
HINT_S = "Check each tool call."


def _segment(rid: str, turns: list[str]) -> dict:
    return {"rollout_id": rid, "session_id": "s1", "task_id": "s1", "turn_spans": [{"turn_id": t} for t in turns]}


REVIEWS = [
    {"rollout_id": "t0", "manager": "dana", "hint": HINT_A},
    {"rollout_id": "t1", "manager": "judge", "hint": "try again"},
    {"rollout_id": "t2", "manager": "dana", "hint": HINT_B},  # the longest: segment B's
    {"rollout_id": "t3", "manager": "judge", "hint": "be careful"},
]


def test_each_segment_gets_the_longest_usable_hint_of_its_own_turns():
    """Mutants opd-live-other-segments-hint, opd-live-shortest-hint: segment A (t0, t1) gets HINT_A, not
    segment B's longer HINT_B, nor the session review's shorter HINT_S."""
    session_review = {"rollout_id": "s1", "manager": "judge", "hint": HINT_S}
    decision, _, review = segment_hint(_segment("seg-a", ["t0", "t1"]), REVIEWS + [session_review])
    assert (decision, review["hint"]) == (opd.USED, HINT_A)
    decision, _, review = segment_hint(_segment("seg-b", ["t2"]), REVIEWS + [session_review])
    assert (decision, review["hint"]) == (opd.USED, HINT_B)


def test_a_session_review_counts_for_every_segment_and_a_trivial_hint_is_reported():
    """Mutants opd-live-session-review-ignored, opd-live-trivial-as-no-hint: segment C (t3) has only a
    trivial turn hint; with a session review it gets the session's hint."""
    decision, reason, review = segment_hint(_segment("seg-c", ["t3"]), REVIEWS)
    assert (decision, review["hint"]) == (opd.TRIVIAL, "be careful") and "generic" in reason
    decision, _, review = segment_hint(_segment("seg-c", ["t3"]), REVIEWS + [{"rollout_id": "s1", "manager": "judge", "hint": HINT_S}])
    assert (decision, review["hint"]) == (opd.USED, HINT_S)
    assert segment_hint(_segment("seg-d", ["t9"]), REVIEWS)[::2] == (opd.NO_HINT, None)


def test_reviews_of_turns_take_both_ends_of_a_segment_and_only_later_session_verdicts():
    """Mutants opd-live-last-turn-excluded, opd-live-earlier-session-verdict: a continuation of turns
    2..3 gets the reviews of turns 2 and 3 and the session review made after turn 2, not the earlier one."""
    t0 = now_utc()
    index = {"t0": 0, "t1": 1, "t2": 2, "t3": 3}
    revs = [{"rollout_id": t, "created_at": t0} for t in index]
    revs += [{"rollout_id": "s1", "created_at": t0 - timedelta(minutes=1), "hint": "early"},
             {"rollout_id": "s1", "created_at": t0 + timedelta(minutes=1), "hint": "late"}]
    got = sessions.reviews_of_turns("s1", revs, index, 2, 3, first_at=t0)
    assert [(r["rollout_id"], r.get("hint")) for r in got] == [("t2", None), ("t3", None), ("s1", "late")]
    assert [r["rollout_id"] for r in sessions.reviews_of_turns("s1", revs, index, 0, 1)] == ["t0", "t1", "s1", "s1"]


def test_the_user_text_is_the_last_user_message_of_the_segments_first_turn(home):
    """Mutants opd-live-first-user-message, opd-live-last-turns-messages."""
    lake = Lakehouse(home / "lake")
    now = now_utc()
    msgs = {"t2": [{"role": "user", "content": "What is 6 * 7?"}, {"role": "assistant", "content": "42"},
                   {"role": "user", "content": "Double it."}],
            "t3": [{"role": "user", "content": "And halve that?"}]}
    lake.append("turns", [{"turn_id": t, "session_id": "s1", "tenant": "acme", "turn_index": i, "choice_index": 0,
                           "messages": json.dumps(m), "created_at": now} for i, (t, m) in enumerate(msgs.items())])
    seg = _segment("seg-b", ["t2", "t3"])
    assert sessions.segment_user_texts(lake, [seg]) == {"seg-b": "Double it."}


class CharTokenizer:
    """One token per character: every prefix decodes to itself, so a hint's place is exact."""

    def decode(self, ids, clean_up_tokenization_spaces=False):
        return "".join(chr(i) for i in ids)

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [ord(c) for c in text]}


def test_the_hint_goes_right_after_the_last_occurrence_of_the_user_text():
    """Mutants opd-live-first-occurrence, opd-live-boundary-late: the question was asked twice (the
    user repeated it); the hint goes after the second, at the exact character."""
    tok = CharTokenizer()
    prompt = "<user>Double it.</user><assistant>84</assistant><user>Double it.</user><assistant>"
    out = tok.decode(opd.hinted_prompt_ids(tok, tok(prompt)["input_ids"], "Double it.", " Use the last result. "))
    at = prompt.rindex("Double it.") + len("Double it.")
    assert out == prompt[:at] + "\n\n" + opd.HINT_PREFIX + "Use the last result." + prompt[at:]


def test_the_signal_is_clipped_masked_and_kept_only_above_the_minimum_effect():
    """Mutants opd-live-mask-dropped, opd-live-clip-default, opd-live-min-effect-default,
    opd-live-effect-signed: clip 0.5 and a minimum effect of 0.2 (non-default); context tokens (mask 0)
    get no signal; a signal of +0.3 and -0.3 has a mean |signal| of 0.3, not 0."""
    config = GRPOConfig(w_opd=1.0, opd_clip=0.5, opd_min_effect=0.2)
    item = opd.OPDItem([1], [1, 2], [5, 6, 7, 8], temperature=0.6, completion_mask=[1, 0, 1, 1])
    row = {"decision": opd.USED, "reason": ""}
    fill_signal(row, item, [-1.0, -0.5, -2.0, -1.0], [-2.0, -3.0, -1.7, -1.3], config)
    assert row["opd_signal"] == pytest.approx([0.5, 0.0, -0.3, 0.3])
    assert row["signal_mean"] == pytest.approx(0.5 / 4) and row["decision"] == opd.USED
    weak = {"decision": opd.USED, "reason": ""}
    fill_signal(weak, item, [-1.0, -1.0, -1.0, -1.0], [-1.1, -5.0, -0.9, -1.1], config)  # mean |signal| 0.075 (the context's 4.0 masked)
    assert weak["opd_signal"] == pytest.approx([0.1, 0.0, -0.1, 0.1]) and weak["decision"] == opd.NO_EFFECT
    assert "0.2" in weak["reason"]
    assert opd.has_effect([0.3, -0.3], 0.3) and not opd.has_effect([0.3, -0.3], 0.31) and not opd.has_effect([], 0.0)
