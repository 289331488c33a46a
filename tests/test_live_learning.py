"""The live-learning script's manager rule and intervals, checked by hand (experiments/live_learning/run.py)."""

from __future__ import annotations

import pytest

from experiments.live_learning.run import manager_review, paired_bootstrap, wilson


@pytest.mark.parametrize(("reply", "finished", "styled", "correct"), [
    ("Ben has 3 + 6 = 9 stickers.", True, True, True),         # one line, ended by itself, right
    ("  Ben has 10 stickers.\n", True, True, False),            # surrounding whitespace is not a second line
    ("Ben has 3 + 6 = 9 stickers.\nSo 9.", True, False, True),  # a second line
    ("Ben has 3 + 6 = 9 stickers and", False, False, True),     # cut at max_tokens
    ("Nine stickers.", True, False, False),                     # states no number
    ("", True, False, False),
])
def test_the_manager_wants_one_line_that_states_the_result(reply, finished, styled, correct):
    r = manager_review(reply, 9, finished)
    assert (r["styled"], r["correct"]) == (styled, correct)
    assert r["score"] == pytest.approx(0.8 * styled + 0.2 * correct)
    assert bool(r["hint"]) != styled  # a hint says what the manager wants, only when it was not done
    assert ("result is 9" in r["critique"]) != correct


def test_wilson_matches_hand_computed_values():
    assert wilson(0, 32)[0] == 0.0 and wilson(0, 32)[1] == pytest.approx(0.1072, abs=1e-4)
    lo, hi = wilson(16, 32)
    assert (lo, hi) == (pytest.approx(0.3363, abs=1e-4), pytest.approx(0.6637, abs=1e-4))


def test_paired_bootstrap_of_identical_runs_is_zero_and_of_a_clear_gain_excludes_zero():
    base = [0, 1] * 16
    assert paired_bootstrap(base, base) == (0.0, 0.0, 0.0)
    mean, lo, hi = paired_bootstrap([1] * 32, base)
    assert mean == 0.5 and 0 < lo <= mean <= hi
