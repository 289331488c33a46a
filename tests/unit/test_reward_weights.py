"""The one reward-weight parser (rewards/scoring.py): the ``review.reward_weights`` setting and a
re-score's ``--weights`` / ``reward_versions`` config read the same rules and fail with the same shape."""

from __future__ import annotations

import pytest

from tentalis_pipelines.rewards.scoring import RewardWeights, parse_weight_overrides, parse_weights


def test_flat_and_per_environment_overrides():
    assert parse_weight_overrides('{"manager": 1, "format": 0}') == {"*": {"manager": 1.0, "format": 0.0}}
    assert parse_weight_overrides('{"math": {"format": 0.0}, "*": {"manager": 2}}') == {"math": {"format": 0.0},
                                                                                          "*": {"manager": 2.0}}
    assert parse_weight_overrides({"manager": 0.5}) == {"*": {"manager": 0.5}}  # a mapping, as a config gives it
    for empty in (None, "", "  ", "{}", {}):
        assert parse_weight_overrides(empty) == {}


def test_the_setting_is_flat_and_fills_in_the_math_defaults():
    assert parse_weights('{"manager": 1}') == RewardWeights(manager=1.0)
    assert parse_weights('{"outcome": 0, "format": 0, "process": 0, "manager": 1}') == RewardWeights(0.0, 0.0, 0.0, 1.0)
    assert parse_weights("") is None and parse_weights("{}") is None  # the per-environment defaults
    with pytest.raises(ValueError, match=r"review.reward_weights: applies to every environment: .*\['math'\]"):
        parse_weights('{"math": {"manager": 1}}')


@pytest.mark.parametrize(("bad", "problem"), [
    ("{manager: 1}", "not valid JSON"),
    ("[1]", "must be a JSON object, not list"),
    ('{"manger": 1}', "unknown reward component 'manger'"),
    ('{"math": {"speed": 1}}', "unknown reward component 'speed' for 'math'"),
    ('{"math": 1}', "the weights for 'math' must be an object, not int"),
    ('{"math": {"manager": 1}, "format": 0}', "mixes environments ['math'] with other keys ['format']"),
    ('{"manager": -0.5}', "weight 'manager' must be a finite number of 0 or more, not -0.5"),
    ('{"manager": NaN}', "weight 'manager' must be a finite number of 0 or more, not nan"),
    ('{"manager": Infinity}', "weight 'manager' must be a finite number of 0 or more, not inf"),
    ('{"manager": true}', "weight 'manager' must be a finite number of 0 or more, not True"),
    ('{"manager": "1"}', "weight 'manager' must be a finite number of 0 or more, not '1'"),
])
def test_bad_weights_name_the_input_the_problem_and_the_fix(bad, problem):
    with pytest.raises(ValueError) as exc:
        parse_weight_overrides(bad, source="--weights")
    msg = str(exc.value)
    assert msg.startswith(f"--weights: {problem}"), msg
    assert 'Fix: give a JSON object of weights for outcome, format, process, manager, each a number >= 0, e.g. {"manager": 1.0}' in msg
    with pytest.raises(ValueError, match=r"^review.reward_weights: .*Fix: "):  # the setting: same rule, same shape
        parse_weights(bad)
