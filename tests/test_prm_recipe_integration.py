"""The tests of ``tests/unit/test_prm_recipe.py`` that cost more CPU than the unit tier allows (tests/cpu_budget.py):
the same tests, moved here unchanged; the unit file keeps the rest."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tentalis_pipelines.reviewers.prm_head import (
    HeadConfig,
    out_of_fold_scores,
    score_steps,
    train_head,
)


def test_step_weights_are_a_weighted_maximum_likelihood():
    """Two identical features, one labelled correct with weight 3, one wrong with weight 1: the linear head's
    only freedom is its bias, and the weighted log-likelihood 3 log p + log(1 - p) peaks at p = 3/4. With the
    classes balanced on weighted counts (pos_weight = 1/3) both weigh the same: p = 1/2. Unweighted: 1/2 too,
    and all-ones weights are the unweighted head exactly."""
    x = np.ones((2, 1), dtype=np.float32)
    y = np.array([1, 0])
    cfg = HeadConfig(epochs=600, lr=0.05, weight_decay=0.0, balance=False)
    p = score_steps(train_head(x, y, cfg, np.array([3.0, 1.0])), [x[:1]])[0][0]
    assert p == pytest.approx(0.75, abs=2e-3)
    assert score_steps(train_head(x, y, cfg, np.array([1.0, 3.0])), [x[:1]])[0][0] == pytest.approx(0.25, abs=2e-3)
    assert score_steps(train_head(x, y, cfg), [x[:1]])[0][0] == pytest.approx(0.5, abs=2e-3)
    balanced = HeadConfig(epochs=600, lr=0.05, weight_decay=0.0, balance=True)
    assert score_steps(train_head(x, y, balanced, np.array([3.0, 1.0])), [x[:1]])[0][0] == pytest.approx(0.5, abs=2e-3)
    rng = np.random.default_rng(0)
    xs, ys = rng.normal(size=(40, 3)).astype(np.float32), rng.integers(0, 2, 40)
    a, b = train_head(xs, ys, HeadConfig(epochs=50)), train_head(xs, ys, HeadConfig(epochs=50), np.ones(40))
    assert torch.equal(a.net.weight, b.net.weight) and torch.equal(a.net.bias, b.net.bias)
    for bad in (np.ones(39), -np.ones(40), np.zeros(40), np.full(40, np.nan)):
        with pytest.raises(ValueError, match="weights must be 40 finite non-negative numbers"):
            train_head(xs, ys, cfg, bad)


def test_out_of_fold_weights_reach_each_folds_head():
    """Each problem has one correct and one wrong solution of identical features; the wrong ones weigh 3.
    Every fold's head then scores those features 1/4 (weighted maximum likelihood, as above); unweighted, 1/2."""
    groups = [f"p{i}" for i in range(4) for _ in range(2)]
    feats = [np.ones((1, 1), dtype=np.float32) for _ in groups]
    labels = [[1], [0]] * 4
    cfg = HeadConfig(epochs=600, lr=0.05, weight_decay=0.0, balance=False)
    weighted = out_of_fold_scores(feats, labels, groups, cfg, folds=2, seed=0, weights=[1.0, 3.0] * 4)
    assert [s[0] for s in weighted] == pytest.approx([0.25] * 8, abs=2e-3)
    plain = out_of_fold_scores(feats, labels, groups, cfg, folds=2, seed=0)
    assert [s[0] for s in plain] == pytest.approx([0.5] * 8, abs=2e-3)
    with pytest.raises(ValueError, match="one weight per solution, got 7 for 8"):
        out_of_fold_scores(feats, labels, groups, cfg, folds=2, weights=[1.0] * 7)
