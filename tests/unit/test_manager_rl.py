"""The manager's meta-RL reward and split (training/manager_rl.py), checked by hand."""

from __future__ import annotations

import pytest

from tentalis_pipelines.rewards.advantages import group_advantages
from tentalis_pipelines.training import manager_rl, opd
from tentalis_pipelines.training.manager_rl import ManagerRLConfig, ReviewOutcome

HINT = "The question asks you to add 7 to 12: write that as one step."


def outcome(score=0.1, hint=HINT, decision=opd.USED, rescued=3, k=4, verifier=0.1, dense=None):
    return ReviewOutcome(score, hint, decision, rescued, k, verifier, dense)


def test_reward_is_rescue_rate_minus_weighted_score_error():
    # 3 of 4 rescued = 0.75; |0.6 - 0.1| = 0.5; 0.75 - 0.5 * 0.5 = 0.5
    assert manager_rl.manager_reward(outcome(score=0.6), accuracy_weight=0.5) == pytest.approx(0.5)
    # a larger weight charges more: 0.75 - 2 * 0.5 = -0.25
    assert manager_rl.manager_reward(outcome(score=0.6), accuracy_weight=2.0) == pytest.approx(-0.25)
    # an exact score costs nothing
    assert manager_rl.manager_reward(outcome(score=0.1, rescued=1), accuracy_weight=0.5) == pytest.approx(0.25)


def test_an_unusable_hint_is_worth_nothing_whatever_it_rescued():
    for decision in (opd.NO_HINT, opd.TRIVIAL, opd.LEAKS_ANSWER):
        assert manager_rl.hint_value(outcome(decision=decision, rescued=4)) == 0.0
        assert manager_rl.manager_reward(outcome(decision=decision, rescued=4, score=0.1)) == 0.0


def test_an_unparseable_review_is_charged_the_full_distance():
    assert manager_rl.score_error(None, 0.7) == 1.0
    assert manager_rl.manager_reward(outcome(score=None, rescued=0), accuracy_weight=0.5) == pytest.approx(-0.5)
    assert manager_rl.mean_score_error([outcome(score=None), outcome(score=0.4, verifier=0.1)]) == pytest.approx((1.0 + 0.3) / 2)
    assert manager_rl.mean_score_error([]) is None


def test_the_dense_reward_replaces_the_rescue_rate_when_chosen():
    o = outcome(rescued=0, k=0, dense=0.8, score=0.1)
    assert manager_rl.hint_value(o, "dense") == pytest.approx(1 / (1 + 2.718281828459045 ** -0.8))  # 0.68997
    assert manager_rl.hint_value(o, "rescue") == 0.0
    assert manager_rl.hint_value(outcome(dense=None), "dense") == 0.0
    assert manager_rl.manager_reward(o, reward="dense", accuracy_weight=1.0) == pytest.approx(0.68997, abs=1e-5)


def test_a_refused_hint_is_worth_less_than_any_usable_one_under_the_dense_reward():
    """A usable hint that lowers the answer's log-probability (−3 nats: 0.0474) still beats one that leaks
    the answer or is trivial (0): raw, the leak's 0 would beat it and teach the manager to leak."""
    harmful = manager_rl.hint_value(outcome(dense=-3.0), "dense")
    assert harmful == pytest.approx(0.047426, abs=1e-6)
    for decision in (opd.LEAKS_ANSWER, opd.TRIVIAL, opd.NO_HINT):
        assert manager_rl.hint_value(outcome(decision=decision, dense=None), "dense") == 0.0 < harmful
    # the order of usable hints is kept: a plan (+4 nats) over a neutral hint (0: 0.5) over a harmful one
    assert manager_rl.hint_value(outcome(dense=4.0), "dense") == pytest.approx(0.982014, abs=1e-6)
    assert manager_rl.hint_value(outcome(dense=0.0), "dense") == 0.5


def test_the_hint_screen_is_guidances():
    assert manager_rl.hint_decision(HINT, "19") == opd.USED
    assert manager_rl.hint_decision("The answer is 19.", "19") == opd.LEAKS_ANSWER
    assert manager_rl.hint_decision("  ", "19") == opd.NO_HINT
    assert manager_rl.hint_decision("try again", "19") == opd.TRIVIAL
    # the rubric's placeholder, which a trained manager learned to copy, is no hint
    assert manager_rl.hint_decision("<one sentence the worker can act on>", "19") == opd.TRIVIAL


def test_group_advantages_of_a_failures_reviews_by_hand():
    # one failure, four reviews: rewards 0.5, 0, -0.5, 0 -> mean 0, unbiased std sqrt(1/6)
    rewards = [manager_rl.manager_reward(o) for o in (outcome(score=0.6), outcome(decision=opd.TRIVIAL, score=0.1),
                                                     outcome(score=None, rescued=0), outcome(score=0.1, rescued=0))]
    assert rewards == pytest.approx([0.5, 0.0, -0.5, 0.0])
    adv, signal = group_advantages(["f"] * 4, rewards)
    std = (0.5 / 3) ** 0.5  # sum of squares 0.5 over n-1 = 3
    assert adv == pytest.approx([0.5 / (std + 1e-4), 0.0, -0.5 / (std + 1e-4), 0.0])
    assert signal == [True] * 4


def test_the_reward_parts_are_the_score_charge_and_the_hint_value():
    # 3 of 4 rescued, |0.6 - 0.1| = 0.5: parts (-0.25, 0.75), summing to the reward 0.5
    o = outcome(score=0.6)
    assert manager_rl.reward_parts(o, accuracy_weight=0.5) == pytest.approx((-0.25, 0.75))
    assert sum(manager_rl.reward_parts(o, accuracy_weight=0.5)) == pytest.approx(manager_rl.manager_reward(o, accuracy_weight=0.5))
    # an unusable hint: its part is 0, the score's charge stands; an unparseable review: the full distance
    assert manager_rl.reward_parts(outcome(decision=opd.TRIVIAL, score=0.3), accuracy_weight=1.0) == pytest.approx((-0.2, 0.0))
    assert manager_rl.reward_parts(outcome(score=None, rescued=1), accuracy_weight=0.5) == pytest.approx((-0.5, 0.25))
    assert manager_rl.reward_parts(outcome(dense=0.4, rescued=0), reward="dense", accuracy_weight=0.5) == pytest.approx((0.0, 0.598688), abs=1e-6)


def test_decoupled_advantages_keep_a_rare_rescue_from_drowning_in_the_score():
    """Four reviews of one failure: only the last one's hint rescued (1 of 4), and it scored worst. The
    summed reward ranks it last, so one advantage per review would push its hint down; normalised apart,
    its hint tokens get the group's only positive hint advantage."""
    group = [outcome(score=0.1, rescued=0), outcome(score=0.2, rescued=0), outcome(score=0.1, rescued=0), outcome(score=0.9, rescued=1)]
    rewards = [manager_rl.manager_reward(o) for o in group]
    assert rewards == pytest.approx([0.0, -0.05, 0.0, 0.25 - 0.4])  # the rescuing review has the lowest reward
    summed, _ = group_advantages(["f"] * 4, rewards)
    assert summed[3] < 0
    parts = [manager_rl.reward_parts(o) for o in group]
    score_adv, _ = group_advantages(["f"] * 4, [p[0] for p in parts])
    hint_adv, _ = group_advantages(["f"] * 4, [p[1] for p in parts])
    # hint values 0, 0, 0, 0.25: mean 1/16, unbiased std = 0.125
    assert hint_adv == pytest.approx([-0.0625 / 0.1251] * 3 + [0.1875 / 0.1251])
    # score charges 0, -0.05, 0, -0.4: mean -0.1125; only the far-off score is below it
    assert score_adv[3] < 0 < score_adv[1] < score_adv[0] == pytest.approx(score_adv[2])


def test_the_score_tokens_end_with_the_token_that_ends_the_number():
    pieces = {1: " ", 2: "7", 3: ",", 4: ' "critique"', 5: "10", 6: "}", 7: "seven", 8: ".", 9: "5", 10: "-", 11: "3"}

    def decode(ids):
        return "".join(pieces[i] for i in ids)

    assert manager_rl.score_token_count(decode, [1, 2, 3, 4]) == 3  # ' ', '7', ',': the comma closes the field
    assert manager_rl.score_token_count(decode, [5, 6]) == 2
    assert manager_rl.score_token_count(decode, [7, 3]) == 1  # no number: the first token is the (unparseable) score
    assert manager_rl.score_token_count(decode, [2, 8, 9, 3, 4]) == 4  # '7.5' is one number
    assert manager_rl.score_token_count(decode, [10, 11, 3]) == 3  # a negative number, then the comma
    assert manager_rl.score_token_count(decode, [1, 2]) == 2  # all number: all score
    assert manager_rl.score_token_count(decode, []) == 0


def test_field_token_advantages_by_hand():
    assert manager_rl.field_token_advantages(5, 2, -1.0, 0.5) == [-1.0, -1.0, 0.5, 0.5, 0.5]
    assert manager_rl.field_token_advantages(2, 3, -1.0, 0.5) == [-1.0, -1.0]  # a reply shorter than its score span
    assert manager_rl.field_token_advantages(3, 0, -1.0, 0.5) == [0.5, 0.5, 0.5]


def test_the_heldout_split_is_stable_and_near_its_fraction():
    ids = [f"task-{i}" for i in range(2000)]
    held = [t for t in ids if manager_rl.is_heldout(t, 0.25)]
    assert 0.21 < len(held) / len(ids) < 0.29
    assert held == [t for t in ids if manager_rl.is_heldout(t, 0.25)]  # the same call, the same side
    # another seed draws another split; a larger fraction holds out a superset
    assert held != [t for t in ids if manager_rl.is_heldout(t, 0.25, seed=1)]
    assert set(held) <= {t for t in ids if manager_rl.is_heldout(t, 0.5)}


def test_checkpoint_ids_name_parent_failures_and_seed():
    a = manager_rl.manager_checkpoint_id(None, ["r2", "r1"], 0)
    assert a.startswith("m-") and a == manager_rl.manager_checkpoint_id(None, ["r1", "r2"], 0)
    assert a != manager_rl.manager_checkpoint_id("m-x", ["r1", "r2"], 0)
    assert a != manager_rl.manager_checkpoint_id(None, ["r1", "r2"], 1)
    assert a != manager_rl.manager_checkpoint_id(None, ["r1"], 0)
    assert a != manager_rl.manager_checkpoint_id(None, ["r1", "r2"], 0, nonce="again")
    assert manager_rl.sample_id(a, "r1", 0) != manager_rl.sample_id(a, "r1", 1)


@pytest.mark.parametrize("field,value,needle", [("reward", "vibes", "manager reward"), ("num_generations", 1, "at least 2"),
                                                ("rescue_samples", 0, "at least 1"), ("heldout_fraction", 1.0, "strictly between"),
                                                ("accuracy_weight", -0.1, ">= 0"), ("credit", "tokens", "manager credit"),
                                                ("update", "sft", "manager update"), ("per_step_rows", -1, "per_step_rows"),
                                                ("num_iterations", 0, "num_iterations"), ("accepted_per_task", 0, "accepted_per_task"),
                                                ("eval_accepted", -1, "eval_accepted"), ("gate_min_accepted", -1, "gate_min_accepted"),
                                                ("score_targets", "gold", "score_targets"), ("score_targets", "verifier", "best_of_n")])
def test_bad_settings_are_refused_by_name(field, value, needle):
    with pytest.raises(ValueError, match=needle):
        ManagerRLConfig(**{field: value})


def test_the_balanced_score_error_weighs_failures_and_accepted_answers_alike():
    # a manager that scores everything 0: right on 3 failures, wrong by 1 on the one accepted answer
    rows = [(0.0, 0.0, False)] * 3 + [(0.0, 1.0, True)]
    assert manager_rl.balanced_score_error(rows) == pytest.approx((0.0 + 1.0) / 2)  # the plain mean says 0.25
    # one class only: its mean; None scores count 1
    assert manager_rl.balanced_score_error([(None, 0.0, False), (0.2, 0.0, False)]) == pytest.approx(0.6)
    assert manager_rl.balanced_score_error([]) == 0.0


def test_score_separation_by_hand():
    rows = [(0.1, 0.0, False), (0.3, 0.0, False), (0.9, 1.0, True), (None, 1.0, True)]
    assert manager_rl.score_separation(rows) == pytest.approx(0.9 - 0.2)
    assert manager_rl.score_separation([(0.0, 0.0, False), (0.0, 1.0, True)]) == 0.0  # one score for all: no gap
    assert manager_rl.score_separation([(0.5, 0.0, False)]) is None


def test_the_verifiers_score_as_the_manager_writes_it():
    assert [manager_rl.score_target_text(v) for v in (1.0, 0.0, 0.34, 0.36, 0.05)] == ["10,", "0,", "3,", "4,", "0,"]
    from tentalis_pipelines.rewards.llm_manager import PREFILL, parse_review

    assert parse_review(PREFILL + manager_rl.score_target_text(0.7) + ' "critique": "", "hint": ""}')[0] == pytest.approx(0.7)
    with pytest.raises(ValueError, match="outside"):
        manager_rl.score_target_text(1.5)
    assert ManagerRLConfig(update="best_of_n", score_targets="verifier").score_targets == "verifier"


def test_balanced_indices_take_the_first_of_each_class_alike():
    assert manager_rl.balanced_indices([False, True, False, False, True]) == [0, 1, 2, 4]
    assert manager_rl.balanced_indices([True, True, True, False]) == [0, 3]
    assert manager_rl.balanced_indices([False, False]) == [] == manager_rl.balanced_indices([])


def test_balanced_indices_balance_within_each_stratum_so_the_form_says_nothing_of_the_class():
    # round 22's sample, in small: tagged rollouts mostly failures, untagged ones mostly accepted
    correct = [False, False, True, False, True, True, True, False, True]
    form = ["t", "t", "t", "t", "u", "u", "u", "u", "t"]
    # tagged: failures 0, 1, 3 and accepted 2, 8 -> k 2: 0, 1, 2, 8; untagged: accepted 4, 5, 6 and failure 7 -> k 1: 4, 7
    assert manager_rl.balanced_indices(correct, strata=form) == [0, 1, 2, 4, 7, 8]
    # over all rollouts alone (k 4 of 5 accepted and 4 failures) the untagged ones are 2 of 3 accepted
    assert manager_rl.balanced_indices(correct) == [0, 1, 2, 3, 4, 5, 6, 7]
    # a stratum of one class gives nothing; the others still balance
    assert manager_rl.balanced_indices([True, True, False, True], strata=["u", "u", "t", "t"]) == [2, 3]
    with pytest.raises(ValueError, match="one stratum per rollout"):
        manager_rl.balanced_indices([True, False], strata=["t"])


def test_separation_difference_by_hand():
    """The candidate's gap minus the incumbent's, and a bootstrap that resamples within each class."""
    # one accepted answer (both score 1); failures: the candidate says 0, 0, 0.9, the incumbent 0 to all.
    pairs = [(1.0, 1.0, True), (0.0, 0.0, False), (0.0, 0.0, False), (0.9, 0.0, False)]
    diff, lo, hi = manager_rl.separation_difference(pairs, n_boot=4000)
    assert diff == pytest.approx((1.0 - 0.3) - (1.0 - 0.0))
    # three failures drawn with replacement: the candidate's mean is 0 with probability (2/3)^3 = 0.30 (the
    # difference's top) and 0.9 with 1/27 = 0.037 > 0.025 (its bottom). The accepted class always keeps its
    # one row: a bootstrap across classes would draw resamples with no accepted answer, or no failure.
    assert (lo, hi) == (pytest.approx(-0.9), pytest.approx(0.0))
    # constant scores in each class: every resample is the point
    flat = [(0.8, 0.9, True), (0.8, 0.9, True), (0.5, 0.1, False), (0.5, 0.1, False), (0.5, 0.1, False)]
    assert manager_rl.separation_difference(flat) == pytest.approx((0.3 - 0.8, -0.5, -0.5))
    # unparseable scores are left out of a manager's class mean, as in score_separation
    assert manager_rl.separation_difference([(None, 1.0, True), (0.9, 0.5, True), (0.1, 0.0, False)])[0] == pytest.approx(0.8 - 0.75)
    assert manager_rl.separation_difference([(0.9, 0.5, False), (0.1, 0.0, False)]) is None  # no accepted answer
    assert manager_rl.separation_difference([(None, 0.5, True), (0.1, 0.0, False)]) is None  # none the candidate scored


def test_separation_difference_draws_each_class_from_itself(monkeypatch):
    """The bootstrap keeps each class's count: accepted rows are drawn from the accepted ones, failures from
    the failures (the gap is a difference of class means; drawing across classes varies the counts, and a
    resample with no accepted answer says nothing). Percentile intervals sit on the same extremes for the
    small samples above either way, so the draws themselves are checked."""
    import numpy as np

    calls, real = [], np.random.default_rng

    class Recording:
        def __init__(self, seed):
            self.rng = real(seed)

        def integers(self, low, high, size):
            calls.append((low, high, size))
            return self.rng.integers(low, high, size)

    monkeypatch.setattr(np.random, "default_rng", Recording)
    pairs = [(0.9, 0.8, True), (0.7, 0.8, True), (0.1, 0.2, False), (0.0, 0.3, False), (0.4, 0.1, False)]
    manager_rl.separation_difference(pairs, n_boot=5)
    assert sorted(set(calls)) == [(0, 2, 2), (0, 3, 3)] and len(calls) == 10


def test_best_of_n_picks_each_failures_best_hint_and_class_balanced_accurate_scores():
    """By hand. Failure A: hints worth σ(1) = 0.731 and σ(2) = 0.881 and a trivial one (0): the second is
    the demonstration; its exact score is the third review's. Failure B: its best hint is worth σ(-0.5) =
    0.378 ≤ 0.5, no demonstration; its nearest score misses by 0.4. Accepted C: a used hint worth σ(3) is
    not trained (no hint was needed); its score 1.0 is exact. Accepted D: its nearest score misses by 0.8,
    more than 0.5. Scores: one accepted answer scored well, so one failure's (A's, the first) is kept."""
    a = [outcome(score=0.2, verifier=0.0, dense=1.0), outcome(score=0.9, verifier=0.0, dense=2.0),
         outcome(score=0.0, verifier=0.0, decision=opd.TRIVIAL, dense=None)]
    b = [outcome(score=0.4, verifier=0.0, dense=-1.0), outcome(score=0.6, verifier=0.0, dense=-0.5)]
    c = [outcome(score=1.0, verifier=1.0, dense=3.0), outcome(score=0.3, verifier=1.0, dense=None)]
    d = [outcome(score=0.0, verifier=1.0), outcome(score=0.2, verifier=1.0)]
    got = manager_rl.best_of_n_selection([a, b, c, d], [False, False, True, True], reward="dense", min_value=0.5)
    assert got == [[(0.0, 0.0), (0.0, 1.0), (1.0, 0.0)], [(0.0, 0.0), (0.0, 0.0)], [(1.0, 0.0), (0.0, 0.0)], [(0.0, 0.0), (0.0, 0.0)]]
    # With a second accepted answer scored well, B's score is taught too (two of each class).
    d_ok = [outcome(score=0.6, verifier=1.0), outcome(score=0.2, verifier=1.0)]
    got = manager_rl.best_of_n_selection([a, b, c, d_ok], [False, False, True, True], reward="dense", min_value=0.5)
    assert got[1] == [(1.0, 0.0), (0.0, 0.0)] and got[3] == [(1.0, 0.0), (0.0, 0.0)]
    # No accepted answer scored well: no score is taught at all (failures alone collapse it to 0).
    got = manager_rl.best_of_n_selection([a, b], [False, False], reward="dense", min_value=0.5)
    assert [w[0] for g in got for w in g] == [0.0] * 5 and got[0][1] == (0.0, 1.0)


def test_best_of_n_bar_is_strict_ties_go_to_the_first_and_the_rescue_reward_is_read():
    tie = [outcome(dense=2.0, score=0.5, verifier=0.0), outcome(dense=2.0, score=0.5, verifier=0.0)]
    assert manager_rl.best_of_n_selection([tie], [False], reward="dense")[0] == [(0.0, 1.0), (0.0, 0.0)]
    # σ(0) = 0.5 exactly does not clear the default bar of 0.5; a rescue of 3 of 4 does, 2 of 4 does not
    assert manager_rl.best_of_n_selection([[outcome(dense=0.0), outcome(dense=-1.0)]], [False], reward="dense")[0] == \
        [(0.0, 0.0), (0.0, 0.0)]
    rescue = [outcome(rescued=2, k=4), outcome(rescued=3, k=4)]
    assert [w[1] for w in manager_rl.best_of_n_selection([rescue], [False], reward="rescue")[0]] == [0.0, 1.0]
    assert [w[1] for w in manager_rl.best_of_n_selection([rescue], [False], reward="rescue", min_value=0.75)[0]] == [0.0, 0.0]
    with pytest.raises(ValueError, match="2 groups of reviews for 1 correctness flags"):
        manager_rl.best_of_n_selection([tie, tie], [False])


def _x(**kw):
    from tentalis_pipelines.rewards.managers import ReviewInput

    base = dict(reference="12", answer="16", correct=False, answer_tagged=True, format_score=1.0, steps=["14 + 2 = 16"],
                step_scores=[1.0], step_rationales=["ok"], finish_reason="stop", expression="14 - 2")
    return ReviewInput(**{**base, **kw})


def test_the_verifier_proposes_its_plan_or_its_first_wrong_step_and_nothing_for_an_accepted_answer():
    assert manager_rl.proposed_hint(_x(), "verifier") == (
        "The question asks you to subtract 2 from 14: write that as one step (14 - 2 = ...) and put its result in "
        "<answer></answer>.")
    wrong = _x(steps=["14 - 2 = 11"], step_scores=[0.0], step_rationales=["14 - 2 = 11 is wrong (it is 12)"], answer="11")
    assert manager_rl.proposed_hint(wrong, "verifier") == (
        "Step 1 is wrong: 14 - 2 is not 11. Redo that calculation, then carry the corrected value to the answer.")
    # accepted, even where the verifier would write a format hint (right number, steps not in the format)
    assert manager_rl.proposed_hint(_x(correct=True, answer="12", format_score=0.5), "verifier") == ""
    assert manager_rl.proposed_hint(_x(), "none") == ""
    with pytest.raises(ValueError, match="hint proposer 'teacher' is unknown"):
        manager_rl.proposed_hint(_x(), "teacher")
