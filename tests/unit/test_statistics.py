"""The shared intervals (tentalis_pipelines/statistics.py): hand computations, the edge cases the module
decides, and properties that hold for every input."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tentalis_pipelines.statistics import bootstrap_ci, newcombe_interval, paired_bootstrap, wilson_interval

Z2 = 1.96 * 1.96  # 3.8416


# ------------------------------------------------------------------------------------------ Wilson
def test_wilson_at_none_all_and_half_by_the_formula():
    # k = 0: centre = half = (z²/2n) / (1 + z²/n), so lo = 0 and hi = z² / (n + z²) = 3.8416 / 13.8416
    assert wilson_interval(0, 10) == (0.0, pytest.approx(0.277540, abs=1e-6))
    assert wilson_interval(0, 10)[1] == pytest.approx(Z2 / (10 + Z2), abs=1e-12)
    # k = n: the mirror image, lo = n / (n + z²) = 10 / 13.8416 and hi = 1 exactly
    assert wilson_interval(10, 10) == (pytest.approx(0.722460, abs=1e-6), 1.0)
    # k = 5: the centre stays 0.5; half = 1.96 * sqrt(.25/10 + 3.8416/400) / 1.38416 = .263410
    lo, hi = wilson_interval(5, 10)
    assert (lo, hi) == (pytest.approx(0.236590, abs=1e-6), pytest.approx(0.763410, abs=1e-6))


def test_wilson_hand_computed_values_of_the_callers():
    # forensics' judge agreement, 15/20: centre = (.75 + 3.8416/40) / (1 + 3.8416/20) = .84604 / 1.19208 = .70972
    lo, hi = wilson_interval(15, 20)
    half = 1.96 * math.sqrt(0.75 * 0.25 / 20 + Z2 / 1600) / (1 + Z2 / 20)
    assert lo == pytest.approx(0.70972 - half, abs=1e-4) and hi == pytest.approx(0.70972 + half, abs=1e-4)
    # the live-learning experiment's 32 held-out questions
    assert wilson_interval(0, 32) == (0.0, pytest.approx(0.1072, abs=1e-4))
    assert wilson_interval(16, 32) == (pytest.approx(0.3363, abs=1e-4), pytest.approx(0.6637, abs=1e-4))


def test_wilson_edge_cases():
    assert wilson_interval(0, 0) == (0.0, 1.0)  # nothing observed: every proportion is possible
    for k, n in ((-1, 5), (6, 5), (0, -1)):
        with pytest.raises(ValueError, match="0 <= k <= n"):
            wilson_interval(k, n)


# ------------------------------------------------------------------------------------------ Newcombe
def test_newcombe_of_equal_proportions_is_symmetric_about_zero():
    # p1 = p2 = .5: both sides are sqrt((.5 - lo)² + (hi - .5)²) = sqrt(2) * .263410 = .372519
    lo, hi = newcombe_interval(5, 10, 5, 10)
    assert (lo, hi) == (pytest.approx(-0.372519, abs=1e-6), pytest.approx(0.372519, abs=1e-6))
    lo, hi = newcombe_interval(2, 20, 18, 20)  # 10% -> 90%: clearly up
    assert 0 < lo < 0.8 < hi <= 1
    with pytest.raises(ValueError, match="both sides"):
        newcombe_interval(0, 0, 1, 2)


# ------------------------------------------------------------------------------------------ bootstrap
def test_bootstrap_of_two_values_by_hand():
    # resampling [0, 1] twice: means 0, .5, 1 with probabilities 1/4, 1/2, 1/4. The 2.5% and 97.5%
    # quantiles are 0 and 1; the 30% and 70% ones both fall in the .5 mass (cumulative .25 < .3, .75 > .7).
    assert bootstrap_ci([0.0, 1.0]) == (0.0, 1.0)
    assert bootstrap_ci([0.0, 1.0], alpha=0.6) == (0.5, 0.5)


def test_bootstrap_interval_covers_the_mean_and_is_seeded():
    lo, hi = bootstrap_ci([1.0] * 30 + [0.0] * 70)
    assert lo < 0.3 < hi and lo > 0.15 and hi < 0.45
    assert bootstrap_ci([1.0] * 30 + [0.0] * 70) == (lo, hi)
    values = np.linspace(0.0, 1.0, 41)
    assert bootstrap_ci(values, seed=1) != bootstrap_ci(values, seed=2)


def test_bootstrap_edge_cases():
    assert bootstrap_ci([0.7] * 5) == (0.7, 0.7)  # constant: no resample can differ
    assert bootstrap_ci(np.array([3.0])) == (3.0, 3.0)
    with pytest.raises(ValueError, match="at least one value"):
        bootstrap_ci([])
    with pytest.raises(ValueError, match="n_boot"):
        bootstrap_ci([0.0, 1.0], n_boot=0)
    with pytest.raises(ValueError, match="alpha"):
        bootstrap_ci([0.0, 1.0], alpha=1.0)


def test_paired_bootstrap_of_identical_runs_is_zero():
    base = [0, 1] * 16
    assert paired_bootstrap(base, base) == (0.0, 0.0, 0.0)


def test_paired_bootstrap_of_a_clear_gain_excludes_zero():
    mean, lo, hi = paired_bootstrap([1] * 32, [0, 1] * 16)
    assert mean == 0.5 and 0 < lo <= mean <= hi


def test_paired_bootstrap_of_offsetting_changes_straddles_zero():
    # half the items gained, half lost: mean 0, and the interval runs from a loss to a gain
    mean, lo, hi = paired_bootstrap([1, 0] * 20, [0, 1] * 20)
    assert mean == 0.0 and lo < 0 < hi
    assert lo == pytest.approx(-hi, abs=0.1)


def test_paired_bootstrap_edge_cases():
    with pytest.raises(ValueError, match="same items"):
        paired_bootstrap([1, 0], [1])
    with pytest.raises(ValueError, match="at least one value"):
        paired_bootstrap([], [])


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(min_value=-100, max_value=100), min_size=1, max_size=40), st.integers(0, 2**31))
def test_bootstrap_interval_lies_within_the_data(values, seed):
    lo, hi = bootstrap_ci(values, n_boot=200, seed=seed)
    assert min(values) - 1e-9 <= lo <= hi <= max(values) + 1e-9


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.booleans()), min_size=1, max_size=40))
def test_paired_bootstrap_is_antisymmetric(pairs):
    a = [float(x) for x, _ in pairs]
    b = [float(y) for _, y in pairs]
    m1, lo1, hi1 = paired_bootstrap(a, b, n_boot=200)
    m2, lo2, hi2 = paired_bootstrap(b, a, n_boot=200)
    assert m1 == pytest.approx(-m2) and lo1 == pytest.approx(-hi2) and hi1 == pytest.approx(-lo2)
    assert lo1 <= hi1
