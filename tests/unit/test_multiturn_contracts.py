"""``training/multiturn.py``'s pure functions from their contracts, by hand: which review a turn's
reward comes from, how several reviewers are combined, the task family of a session, the groups of
turn advantages, and the trainer's sample (issue 73: the mutants these left alive)."""

from __future__ import annotations

import hashlib
import json
from datetime import datetime, timezone

import pytest

from tentalis_pipelines.training.multiturn import (
    review_score,
    session_family,
    train_sample,
    turn_advantages,
    turn_rewards,
)

T0, T1, T2 = (datetime(2026, 12, 7, h, tzinfo=timezone.utc) for h in (1, 2, 3))


def test_each_reviewers_latest_score_is_averaged_over_reviewers():
    reviews = [
        {"reviewer": "ann", "score": 0.0, "created_at": T2},  # ann's latest, listed first
        {"reviewer": "ann", "score": 1.0, "created_at": T0},
        {"reviewer": "bob", "score": 0.5, "created_at": T1},
    ]
    assert review_score(reviews) == pytest.approx((0.0 + 0.5) / 2)
    # a review without a time sorts after every timed one (taken as the latest), whatever the list order
    assert review_score([{"reviewer": "ann", "score": 1.0, "created_at": T0}, {"reviewer": "ann", "score": 0.0, "created_at": None}]) == 0.0
    assert review_score([{"reviewer": "ann", "score": 0.0, "created_at": None}, {"reviewer": "ann", "score": 1.0, "created_at": T0}]) == 0.0


def test_a_review_without_a_score_is_skipped_and_none_at_all_is_none():
    assert review_score([]) is None
    assert review_score([{"reviewer": "ann", "score": None, "created_at": T0}]) is None
    # the unscored review is newer but does not hide the scored one
    assert review_score([{"reviewer": "ann", "score": 0.25, "created_at": T0}, {"reviewer": "ann", "score": None, "created_at": T2}]) == 0.25
    # nor an older unscored one: the scored reviews after it still count
    assert review_score([{"reviewer": "ann", "score": None, "created_at": T0}, {"reviewer": "bob", "score": 0.75, "created_at": T2}]) == 0.75
    # a score of 0 is a score
    assert review_score([{"reviewer": "ann", "score": 0.0, "created_at": T0}]) == 0.0


def test_the_reviewer_is_its_name_else_its_manager_else_one_anonymous_reviewer():
    by_manager = [{"manager": "verifier", "score": 1.0, "created_at": T0}, {"manager": "llm", "score": 0.0, "created_at": T1}]
    assert review_score(by_manager) == 0.5  # two managers, two reviewers
    anonymous = [{"score": 1.0, "created_at": T0}, {"score": 0.0, "created_at": T1}]
    assert review_score(anonymous) == 0.0  # no name: one reviewer, its latest
    named_over_manager = [{"reviewer": "ann", "manager": "human", "score": 1.0, "created_at": T0},
                          {"reviewer": "bob", "manager": "human", "score": 0.0, "created_at": T1}]
    assert review_score(named_over_manager) == 0.5


def test_a_turns_own_review_wins_over_the_sessions_and_unreviewed_turns_take_the_sessions():
    reviews = [{"rollout_id": "s", "manager": "human", "reviewer": "ann", "score": 0.2, "created_at": T0},
               {"rollout_id": "t1", "manager": "human", "reviewer": "ann", "score": 0.9, "created_at": T0}]
    assert turn_rewards("s", ["t0", "t1"], reviews) == {"t0": (0.2, "session_review"), "t1": (0.9, "turn_review")}
    # no session review: only the reviewed turn has a reward
    assert turn_rewards("s", ["t0", "t1"], reviews[1:]) == {"t1": (0.9, "turn_review")}
    assert turn_rewards("s", ["t0"], []) == {}


def test_a_judges_review_counts_only_when_no_person_reviewed_anything():
    judge = {"rollout_id": "s", "manager": "judge", "reviewer": "judge-m", "score": 0.4, "created_at": T0}
    assert turn_rewards("s", ["t0", "t1"], [judge]) == {"t0": (0.4, "judge"), "t1": (0.4, "judge")}
    person_on_a_turn = {"rollout_id": "t1", "manager": "human", "reviewer": "ann", "score": 1.0, "created_at": T0}
    # a person reviewed one turn: the judge is ignored, the other turn has no reward at all
    assert turn_rewards("s", ["t0", "t1"], [judge, person_on_a_turn]) == {"t1": (1.0, "turn_review")}


def test_the_family_is_a_hash_of_the_first_calls_roles_and_contents():
    msgs = [{"role": "system", "content": "S"}, {"role": "user", "content": "U", "name": "x"}]
    canonical = json.dumps([{"role": "system", "content": "S"}, {"role": "user", "content": "U"}], sort_keys=True)
    expected = "chat-" + hashlib.sha256(canonical.encode()).hexdigest()[:12]
    assert session_family(msgs) == expected
    assert session_family(json.dumps(msgs)) == expected  # the stored JSON text, the same family
    assert session_family([*msgs, "not a message"]) == expected  # foreign entries are ignored
    assert session_family([{"role": "user", "content": "U"}]) != expected
    empty = "chat-" + hashlib.sha256(b"[]").hexdigest()[:12]
    assert session_family(None) == session_family([]) == session_family("[]") == empty
    assert len(expected) == len("chat-") + 12


def test_sessions_of_one_family_are_their_group_and_lone_sessions_share_the_batch_group():
    items = [("famA", "s1", "a1", 1.0, "turn_review"), ("famA", "s2", "a2", 0.0, "turn_review"),
             ("famB", "s3", "b1", 1.0, "session_review"), ("famC", "s4", "c1", 0.0, "judge"),
             ("famA", "s1", "a3", 0.5, "session_review")]
    out = turn_advantages(items, scale_rewards="none")
    assert {t: (a.group, a.source, a.reward) for t, a in out.items()} == {
        "a1": ("famA", "turn_review", 1.0), "a2": ("famA", "turn_review", 0.0), "a3": ("famA", "session_review", 0.5),
        "b1": ("batch", "session_review", 1.0), "c1": ("batch", "judge", 0.0)}
    # famA's mean is 0.5, the batch group's is 0.5 (centred only)
    assert [out[t].advantage for t in ("a1", "a2", "a3", "b1", "c1")] == pytest.approx([0.5, -0.5, 0.0, 0.5, -0.5])
    assert all(a.signal for a in out.values())
    # scaled by the group's unbiased std (+1e-4): famA std = 0.5, batch std = sqrt(0.5)
    scaled = turn_advantages(items)
    assert scaled["a1"].advantage == pytest.approx(0.5 / (0.5 + 1e-4))
    assert scaled["b1"].advantage == pytest.approx(0.5 / (0.5 ** 0.5 + 1e-4))
    # one family with one session only: that lone session's equal rewards carry no signal
    lone = turn_advantages([("f", "s", "t0", 1.0, "x"), ("f", "s", "t1", 1.0, "x")])
    assert [(a.group, a.advantage, a.signal) for a in lone.values()] == [("batch", 0.0, False)] * 2
    assert turn_advantages([]) == {}


def test_the_sample_copies_every_field_and_refuses_a_misaligned_row():
    s = train_sample((1, 2), (3, 4, 5), (0, 1, True), (0.0, 0.5, 0.5), advantage=0.5, old_logps=(None, -0.1, -0.2), temperature=0.4)
    assert (s.prompt_ids, s.completion_ids, s.advantage) == ([1, 2], [3, 4, 5], 0.5)
    assert s.loss_mask == [0, 1, 1] and all(type(m) is int for m in s.loss_mask)
    assert s.token_advantages == [0.0, 0.5, 0.5] and s.old_logps == [None, -0.1, -0.2] and s.temperature == 0.4
    assert type(s.advantage) is float and not s.guided
    assert train_sample([1], [3], [1], [1.0], advantage=1, old_logps=None, temperature=None).old_logps is None
    for mask, adv in (([1, 1], [0.0, 0.5, 0.5]), ([0, 1, 1], [0.5]), ([], [])):
        with pytest.raises(ValueError, match=r"^a multi-turn row's loss_mask and token_advantages must have one entry per completion token$"):
            train_sample([1], [3, 4, 5], mask, adv, advantage=0.0, old_logps=None, temperature=None)
