"""The live-learning script's manager rule, checked by hand (experiments/live_learning/run.py; its intervals are
``tentalis_pipelines.statistics``, tested in test_statistics.py)."""

from __future__ import annotations

import pytest

from experiments.live_learning.run import manager_review


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
