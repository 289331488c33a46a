"""The intervals Tentalis reports, in one place: plain functions over counts, lists and numpy arrays.

* :func:`wilson_interval`: a proportion's Wilson score interval (benchmark accuracy pooled over
  seeds, a judge's agreement with the verifier, a hint's success rate).
* :func:`newcombe_interval`: the difference of two independent proportions (Newcombe's hybrid score
  interval from two Wilson intervals): hint efficacy before and after a checkpoint.
* :func:`bootstrap_ci`: the percentile bootstrap interval of a mean (a benchmark's accuracy).
* :func:`paired_bootstrap`: the mean paired difference of two runs over the same items and its
  percentile bootstrap interval: the promotion gate, a skill's measured effect, the experiments.

Edge cases, decided once for every caller:

* ``wilson_interval``: ``n == 0`` gives ``(0.0, 1.0)``: nothing observed, so every proportion is still
  possible. ``k == 0`` gives a lower end of exactly ``0.0`` and ``k == n`` an upper end of exactly
  ``1.0`` (the formula reaches them only up to rounding). ``n < 0``, ``k < 0`` or ``k > n`` raise
  ValueError. The interval always holds ``k / n`` and lies in ``[0, 1]``.
* ``newcombe_interval``: each side needs at least one observation (ValueError otherwise: a difference
  against nothing is not a number; callers record it as missing).
* ``bootstrap_ci`` and ``paired_bootstrap``: empty input raises ValueError (a mean of nothing has no
  interval; a caller with a convention for "no items", such as an accuracy of 0, applies it itself).
  Constant input (every value equal, e.g. two identical runs) gives the point interval ``(v, v)``
  without resampling: no resample can differ. Resampling is seeded, so a decision is reproducible.
  ``paired_bootstrap`` raises ValueError when the two runs differ in length.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

Z95 = 1.96  # the normal quantile of a two-sided 95% interval


def wilson_interval(k: int, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval of the proportion ``k / n`` (95% at the default ``z``); sensible at small
    ``n`` and at 0 or ``n`` successes, where the normal approximation collapses to a point."""
    if n < 0 or k < 0 or k > n:
        raise ValueError(f"a proportion needs 0 <= k <= n, got k={k}, n={n}")
    if n == 0:
        return 0.0, 1.0
    p = k / n
    den = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / den
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    lo = 0.0 if k == 0 else max(0.0, min(p, centre - half))
    hi = 1.0 if k == n else min(1.0, max(p, centre + half))
    return lo, hi


def newcombe_interval(k1: int, n1: int, k2: int, n2: int, z: float = Z95) -> tuple[float, float]:
    """Interval of ``p2 - p1`` (after minus before) for two independent proportions: Newcombe's method
    10, the hybrid score interval built from each side's Wilson interval."""
    if n1 <= 0 or n2 <= 0:
        raise ValueError(f"a difference of proportions needs observations on both sides, got n1={n1}, n2={n2}")
    p1, p2 = k1 / n1, k2 / n2
    l1, u1 = wilson_interval(k1, n1, z)
    l2, u2 = wilson_interval(k2, n2, z)
    d = p2 - p1
    return d - math.sqrt((p2 - l2) ** 2 + (u1 - p1) ** 2), d + math.sqrt((u2 - p2) ** 2 + (p1 - l1) ** 2)


def bootstrap_ci(values: Sequence[float] | np.ndarray, *, n_boot: int = 2000, seed: int = 0,
                 alpha: float = 0.05) -> tuple[float, float]:
    """Percentile bootstrap ``1 - alpha`` interval of the mean of ``values``: ``n_boot`` resamples with
    replacement (numpy's generator seeded with ``seed``), the ``alpha / 2`` and ``1 - alpha / 2``
    quantiles of their means."""
    v = np.asarray(values, dtype=np.float64).ravel()
    if v.size == 0:
        raise ValueError("a bootstrap interval needs at least one value")
    if n_boot < 1 or not 0 < alpha < 1:
        raise ValueError(f"a bootstrap needs n_boot >= 1 and 0 < alpha < 1, got n_boot={n_boot}, alpha={alpha}")
    if np.all(v == v[0]):
        return float(v[0]), float(v[0])
    rng = np.random.default_rng(seed)
    means = v[rng.integers(0, v.size, size=(n_boot, v.size))].mean(axis=1)
    return float(np.quantile(means, alpha / 2)), float(np.quantile(means, 1 - alpha / 2))


def paired_bootstrap(a: Sequence[float] | np.ndarray, b: Sequence[float] | np.ndarray, *, n_boot: int = 2000,
                     seed: int = 0, alpha: float = 0.05) -> tuple[float, float, float]:
    """(mean of ``a - b``, its interval's low end, high end): two runs scored on the same items, in the
    same order, compared item by item (:func:`bootstrap_ci` of the per-item differences)."""
    x = np.asarray(a, dtype=np.float64).ravel()
    y = np.asarray(b, dtype=np.float64).ravel()
    if x.size != y.size:
        raise ValueError(f"a paired comparison needs the same items on both sides, got {x.size} and {y.size} values")
    diffs = x - y
    lo, hi = bootstrap_ci(diffs, n_boot=n_boot, seed=seed, alpha=alpha)
    return float(diffs.mean()), lo, hi
