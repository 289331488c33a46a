"""Is there a hint in the manager's rescue reward? A dispersion test of the rescue counts it trains on.

Each usable hint of a manager update was measured by ``rescue_k`` worker samples, ``rescued`` of them
accepted (``manager_samples``). If the hints differed in what they do, the counts would vary more than
draws from one binomial with the pooled rate: the index of dispersion ``D = Σ (x − k p)² / (k p (1 − p))``
is χ² with N − 1 degrees of freedom when every hint has the same rescue rate ``p``. Tasks differ in
difficulty too, which alone inflates D; what GRPO compares is the reviews of one failure, so the test that
matters is within groups: given each group's total of rescued samples, the null (its hints all alike) puts
the successes among the group's samples at random (a multivariate hypergeometric), and the statistic
``Σ x²`` over every hint is compared with 20,000 such draws (an exact permutation test). A p-value far from
0 says the differences the manager's GRPO sees between its hints are the worker's sampling noise: no
update can learn a better hint from them, whatever the credit assignment.

Also per group (a failure's reviews): the share of groups where the reviews' rescue counts differ at all
(a group with no difference gives the hint tokens no advantage), against the share a null draw gives.

Usage: python -m experiments.manager_rl.signal --home /work/runs/mgr-exp [--home H2 ...]
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from pathlib import Path

import numpy as np
from scipy import stats

from tentalis_pipelines.lakehouse import Lakehouse


def dispersion(counts: list[int], k: int) -> tuple[float, float, int, float]:
    """(pooled rate, D, degrees of freedom, p-value of D under one binomial(k, p) for every hint)."""
    x = np.asarray(counts, dtype=float)
    p = x.sum() / (k * len(x))
    if p in (0.0, 1.0):
        return p, 0.0, len(x) - 1, 1.0
    d = float(((x - k * p) ** 2).sum() / (k * p * (1 - p)))
    return p, d, len(x) - 1, float(stats.chi2.sf(d, len(x) - 1))


def within_group_test(groups: list[list[int]], k: int, draws: int = 20000, seed: int = 0) -> float:
    """Permutation p-value of Σ x² over every hint of every group, each group's total fixed (its successes
    placed at random among its hints' k samples each): small when some hints rescue more than their
    group's others beyond chance."""
    rng = np.random.default_rng(seed)
    live = [g for g in groups if len(g) > 1 and 0 < sum(g) < k * len(g)]
    if not live:
        return 1.0
    observed = sum(int(x) ** 2 for g in live for x in g)
    null = np.zeros(draws)
    for g in live:
        sample = rng.multivariate_hypergeometric([k] * len(g), sum(g), size=draws)
        null += (sample.astype(float) ** 2).sum(axis=1)
    return float((1 + (null >= observed).sum()) / (1 + draws))


def null_differing_share(sizes: list[int], k: int, p: float, draws: int = 2000, seed: int = 0) -> float:
    """Share of groups (of the given sizes) whose binomial(k, p) counts are not all equal, under the null."""
    rng = np.random.default_rng(seed)
    hits = 0
    for _ in range(draws):
        for n in sizes:
            c = rng.binomial(k, p, size=n)
            hits += int(c.min() != c.max())
    return hits / (draws * len(sizes))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--home", action="append", required=True)
    a = ap.parse_args()
    print("| home | checkpoint | usable hints | rescue k | pooled rate | D (df) | p (one rate for all hints) | groups with differing "
          "counts: seen / null | p within groups (hints of one failure alike) |\n|---|---|---|---|---|---|---|---|---|")
    for home in a.home:
        lake = Lakehouse(Path(home) / "lakehouse")
        rows = lake.read("manager_samples").to_pylist()
        order = sorted({r["checkpoint_id"] for r in rows}, key=lambda c: min(r["created_at"] for r in rows if r["checkpoint_id"] == c))
        for ck in order:
            used = [r for r in rows if r["checkpoint_id"] == ck and r["rescue_k"]]
            if not used:
                continue
            k = used[0]["rescue_k"]
            p, d, df, pv = dispersion([r["rescued"] for r in used], k)
            groups = defaultdict(list)
            for r in used:
                groups[r["rollout_id"]].append(r["rescued"])
            multi = [g for g in groups.values() if len(g) > 1]
            seen = sum(min(g) != max(g) for g in multi) / len(multi) if multi else float("nan")
            null = null_differing_share([len(g) for g in multi], k, p) if multi else float("nan")
            pw = within_group_test(list(groups.values()), k)
            print(f"| {Path(home).name} | {ck} | {len(used)} | {k} | {p:.3f} | {d:.1f} ({df}) | {pv:.2f} | {seen:.2f} / {null:.2f} "
                  f"| {pw:.2f} |")


if __name__ == "__main__":
    main()
