"""One rule for a review score wherever one enters (`rewards.managers.review_score`): the gateway's
`POST /v1/reviews` and `tentalis import-reviews` agree on every value."""

from __future__ import annotations

import math

import pytest

from tentalis_pipelines.gateway.app import ReviewRequest
from tentalis_pipelines.rewards.managers import review_score, validate_human_review


@pytest.mark.parametrize("value, expected", [(0, 0.0), (1, 1.0), (0.25, 0.25), (1.0, 1.0)])
def test_numbers_in_the_unit_interval_are_scores(value, expected):
    assert review_score(value) == expected
    assert ReviewRequest(session_id="s", score=value).score == expected


@pytest.mark.parametrize("value", [True, False, None, "0.5", "", [0.5], {"v": 1}, -0.01, 1.01, math.nan, math.inf, -math.inf])
def test_everything_else_is_refused_by_the_gateway_as_by_review_score(value):
    with pytest.raises(ValueError, match="'score' must be a number in \\[0, 1\\]"):
        review_score(value)
    with pytest.raises(ValueError):  # pydantic's ValidationError is a ValueError
        ReviewRequest(session_id="s", score=value)


def test_numeric_text_is_read_only_where_the_format_is_text():
    """A CSV cell is text: import-reviews reads "0.5"; JSON bodies must send a number."""
    assert review_score("0.5", text_ok=True) == 0.5
    assert validate_human_review({"rollout_id": "r1", "score": "0.5"})["score"] == 0.5
    for bad in ("true", "nan", "1.5", " "):
        with pytest.raises(ValueError, match="score"):
            validate_human_review({"rollout_id": "r1", "score": bad})
    with pytest.raises(ValueError, match="score"):
        validate_human_review({"rollout_id": "r1", "score": True})
