"""The property tests of ``tests/unit/test_statistics.py`` that cost more CPU than the unit tier should spend
(hypothesis draws hundreds of cases each): the same tests, moved here unchanged; the unit file keeps the rest."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tentalis_pipelines.statistics import wilson_interval


@settings(max_examples=300, deadline=None)
@given(st.integers(min_value=1, max_value=100_000).flatmap(lambda n: st.tuples(st.integers(0, n), st.just(n))))
def test_wilson_holds_the_proportion_inside_zero_one(kn):
    k, n = kn
    lo, hi = wilson_interval(k, n)
    assert 0.0 <= lo <= k / n <= hi <= 1.0
    assert lo < hi  # never a point: even k = 0 or k = n leaves room on one side


@settings(max_examples=300, deadline=None)
@given(st.integers(min_value=1, max_value=100_000).flatmap(lambda n: st.tuples(st.integers(0, n - 1), st.just(n))))
def test_wilson_is_monotonic_in_k(kn):
    k, n = kn
    (lo1, hi1), (lo2, hi2) = wilson_interval(k, n), wilson_interval(k + 1, n)
    assert lo1 < lo2 and hi1 < hi2
