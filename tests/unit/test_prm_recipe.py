"""The PRM head's recipe, by hand: decision rules, ProcessBench-shaped renderings, pooling and centring of
features, and its judge_agreement rows."""

from __future__ import annotations

import random
from datetime import datetime, timezone

import numpy as np
import pytest
import torch

from tentalis_pipelines.reviewers.prm_agreement import processbench_row, verifier_row
from tentalis_pipelines.reviewers.prm_head import (
    DecisionRule,
    HeadConfig,
    choose_rule,
    fold_of,
    out_of_fold_scores,
    pool_steps,
    shape_features,
)
from tentalis_pipelines.reviewers.prm_labels import LabelledSolution, latex_equation, processbench_style

NOW = datetime(2026, 11, 26, tzinfo=timezone.utc)


def test_threshold_rule_is_the_first_step_below():
    rule = DecisionRule("threshold", 0.5)
    assert rule.predict([0.9, 0.5, 0.4, 0.1]) == 2  # 0.5 is not below 0.5
    assert rule.predict([None, 0.2]) == 1 and rule.predict([0.6, 0.7]) == -1 and rule.predict([]) == -1


def test_drop_rule_flags_a_fall_below_the_running_mean():
    rule = DecisionRule("drop", threshold=0.1, drop=0.3)
    # running means before steps 1, 2, 3: 0.9, 0.85, (0.9+0.8+0.7)/3 = 0.8; step 3 (0.45) is 0.35 below
    assert rule.predict([0.9, 0.8, 0.7, 0.45, 0.05]) == 3
    assert rule.predict([0.9, 0.8, 0.7, 0.55]) == -1  # 0.25 below: not enough
    assert rule.predict([0.05, 0.9]) == 0  # the absolute floor still holds at the first step
    assert rule.predict([0.9, None, 0.55]) == 2  # an unscored step neither counts nor breaks the mean


def test_argmin_rule_is_the_lowest_step_when_low_enough():
    rule = DecisionRule("argmin", 0.4)
    assert rule.predict([0.3, 0.9, 0.1, 0.2]) == 2
    assert rule.predict([0.5, 0.45]) == -1 and rule.predict([None, None]) == -1
    with pytest.raises(ValueError, match="not one of"):
        DecisionRule("median")


def test_choose_rule_picks_the_parameters_with_the_best_held_out_f1():
    # Solution A (first error 2) starts high and falls; B (all correct) is uniformly low; C (error 0).
    scores = [[0.9, 0.9, 0.6, 0.5], [0.45, 0.5, 0.45], [0.2, 0.9]]
    labels = [2, -1, 0]
    rule, f1 = choose_rule(scores, labels, "drop", drops=(0.2,))
    # No threshold alone gets all three (A's 0.6 is above B's 0.45-0.5); threshold below 0.45 plus a 0.2 drop does.
    assert f1 == 1.0 and rule.kind == "drop" and rule.drop == 0.2 and 0.2 < rule.threshold <= 0.45
    assert [rule.predict(s) for s in scores] == labels
    t_rule, t_f1 = choose_rule(scores, labels, "threshold")
    assert t_rule.kind == "threshold" and t_f1 < 1.0


def test_fold_of_deals_shuffled_problems_round_robin():
    groups = ["p3", "p1", "p2", "p1", "p4", "p5", "p2"]
    f = fold_of(groups, 2, seed=7)
    order = sorted({"p1", "p2", "p3", "p4", "p5"})
    random.Random(7).shuffle(order)
    assert f == {g: i % 2 for i, g in enumerate(order)}  # by hand: shuffle the sorted ids, deal 0, 1, 0, 1, 0
    assert sorted(f.values()) == [0, 0, 0, 1, 1]
    assert fold_of(list(reversed(groups)), 2, seed=7) == f  # the order of the solutions does not matter
    assert fold_of(groups, 5, seed=0).keys() == f.keys() and sorted(fold_of(groups, 5, seed=0).values()) == [0, 1, 2, 3, 4]
    with pytest.raises(ValueError, match="5 problem\\(s\\) cannot fill 6 folds"):
        fold_of(groups, 6, seed=0)
    with pytest.raises(ValueError, match="at least 2 folds"):
        fold_of(groups, 1, seed=0)


def test_out_of_fold_scores_come_from_heads_that_never_saw_the_problem():
    """Every step looks the same (one feature, tiny noise); the label is the problem's fold: fold 0's
    problems are all correct, fold 1's all wrong. A head that never saw fold 0 learned only wrong steps, so
    fold 0's steps score low; fold 1's score high: the out-of-fold scores are the labels inverted. A head
    that saw the problem (in-sample) would score them the other way round. A wrong-labelled rendering kept
    out of training (``trains`` false) is scored but not learned from."""
    groups = [f"p{i}" for i in range(8)]
    fold = fold_of(groups, 2, seed=1)
    rng = np.random.default_rng(0)
    feats = [rng.normal(0, 1e-3, (3, 1)).astype(np.float32) + 1.0 for _ in groups]
    labels = [[1, 1, 1] if fold[g] == 0 else [0, 0, 0] for g in groups]
    cfg = HeadConfig(epochs=200, lr=0.1, weight_decay=0.0, balance=True)
    # one more solution of a fold-1 problem, labelled correct, that must not train fold 0's head
    odd = next(g for g in groups if fold[g] == 1)
    scores = out_of_fold_scores(feats + [feats[0]], labels + [[1, 1, 1]], groups + [odd], cfg, folds=2, seed=1,
                                trains=[True] * len(groups) + [False])
    assert len(scores) == len(groups) + 1 and all(len(s) == 3 for s in scores)
    for g, s in zip(groups, scores):
        if fold[g] == 0:
            assert max(s) < 0.2, (g, s)  # taught only by fold 1's wrong steps (with the odd row: about 0.5)
        else:
            assert min(s) > 0.8, (g, s)
    assert min(scores[-1]) > 0.8  # scored, by the head of fold 0's problems
    with pytest.raises(ValueError, match="one label list and one group per solution"):
        out_of_fold_scores(feats, labels[:-1], groups, cfg, folds=2)


def test_latex_equation_writes_processbench_style():
    assert latex_equation("He has 5*3 = 15 apples.") == r"He has \( 5 \times 3 = 15 \) apples."
    assert latex_equation("each got 50/5 = 10.") == r"each got \( \frac{50}{5} = 10 \)."
    assert latex_equation("cost $3 + $2 = $5.") == r"cost \( \$3 + \$2 = \$5 \)."
    assert latex_equation("no arithmetic here") == "no arithmetic here"


def test_processbench_style_merges_steps_and_carries_the_labels():
    probe = random.Random(0)
    sizes, i = [], 0
    while i < 5:
        k = probe.randint(1, 3)
        sizes.append(min(k, 5 - i))
        i += k
    starts = [sum(sizes[:g]) for g in range(len(sizes))]
    assert len(sizes) >= 2  # the seed merges: the check below crosses group boundaries
    for fe in range(5):  # every position of the first error, each group's first and later members
        labels = (1,) * fe + (0,) * (5 - fe)
        sol = LabelledSolution("p", "q", ("a 1+1 = 2.", "b.", "c.", "d.", "e."), fe, labels, "corrupted:result")
        out = processbench_style(sol, random.Random(0))
        assert [len(s.split(". ")) for s in out.steps] == sizes  # merged runs of the seeded lengths
        assert out.steps[0].startswith(r"a \( 1 + 1 = 2 \).")
        assert out.first_error == max(g for g, st in enumerate(starts) if st <= fe)
        assert out.labels == tuple(int(st + n - 1 < fe) for st, n in zip(starts, sizes))
        assert out.kind == "corrupted:result+pbstyle" and out.problem_id == "p"
    ok = LabelledSolution("p", "q", ("x.", "y."), -1, (1, 1), "reference")
    assert processbench_style(ok, random.Random(1)).first_error == -1


def test_pool_steps_last_mean_and_both():
    h = torch.arange(12, dtype=torch.float32).reshape(6, 2)  # token t has [2t, 2t+1]
    spans = [(1, 2), (3, 5)]
    assert pool_steps(h, spans, "last").tolist() == [[4, 5], [10, 11]]
    assert pool_steps(h, spans, "mean").tolist() == [[3, 4], [8, 9]]  # tokens 1-2 and 3-5
    assert pool_steps(h, spans, "last+mean").tolist() == [[4, 5, 3, 4], [10, 11, 8, 9]]


def test_shape_features_concatenates_layers_and_centres_per_solution():
    f = np.array([[[1, 2], [3, 4]], [[5, 6], [7, 8]]], np.float16)  # 2 steps, 2 layers, dim 2
    assert shape_features(f, False).tolist() == [[1, 2, 3, 4], [5, 6, 7, 8]]
    assert shape_features(f, True).tolist() == [[-2, -2, -2, -2], [2, 2, 2, 2]]
    assert shape_features(np.zeros((0, 2, 2)), True).shape == (0, 4)


def test_head_config_checks_its_recipe():
    assert HeadConfig(layer=14, layers=[6, 10, 14]).read_layers == (6, 10, 14)
    assert HeadConfig(layer=6).read_layers == (6,)
    with pytest.raises(ValueError, match="must end at layer 6"):
        HeadConfig(layer=6, layers=(4, 8))
    with pytest.raises(ValueError, match="pooling 'max'"):
        HeadConfig(pooling="max")
    with pytest.raises(ValueError, match="rule 'vote'"):
        HeadConfig(rule="vote")


def test_processbench_row_by_hand():
    # labels: two erroneous (1, 0) and two correct; predictions: 1 (exact), 2 (wrong step), -1, 0
    row = processbench_row("v0003", "gsm8k", [1, 0, -1, -1], [1, 2, -1, 0], NOW)
    assert (row["judge"], row["rubric"], row["window_kind"], row["window_id"]) == ("prm_head:v0003", "first_error", "processbench", "gsm8k")
    assert row["error_accuracy"] == 0.5 and row["correct_accuracy"] == 0.5 and row["f1"] == 0.5
    # pass verdicts: head [0, 0, 1, 0], people [0, 0, 1, 1]: 3 of 4 agree
    assert row["n"] == 4 and row["pass_agreement"] == 0.75 and row["mean_abs_diff"] == 0.25
    assert row["judge_mean"] == 0.25 and row["human_mean"] == 0.5


def test_verifier_row_by_hand():
    row = verifier_row("v0001", [-1, 2, -1, 0, -1], [1.0, 0.0, 0.0, 0.0, 1.0], NOW)
    assert (row["rubric"], row["window_kind"], row["window_id"]) == ("outcome", "verifier", "all")
    # head passes 1, 3, 5; the verifier accepts 1 and 5: agreement on 1, 2, 4, 5
    assert row["n"] == 5 and row["pass_agreement"] == 0.8 and row["judge_mean"] == 0.6 and row["human_mean"] == 0.4
    assert "f1" not in row


def test_a_head_stored_before_pooling_existed_still_reads_the_last_token(tmp_path):
    import json

    from tentalis_pipelines.reviewers.prm_head import HeadCheckpoint, PRMHead

    ck = HeadCheckpoint(PRMHead(4), HeadConfig(layer=6, pooling="last"), 0.3, "m")
    folder = ck.save(tmp_path / "v")
    meta = json.loads((folder / "manifest.json").read_text())
    for key in ("pooling", "layers", "center", "rule", "drop", "dropout", "features"):
        del meta["config"][key]  # the manifest of an older version
    (folder / "manifest.json").write_text(json.dumps(meta))
    old = HeadCheckpoint.load(folder)
    assert old.config.pooling == "last" and old.config.features == "hidden" and old.config.read_layers == (6,) and old.rule == DecisionRule("threshold", 0.3)
