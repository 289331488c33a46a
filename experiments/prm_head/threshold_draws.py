"""How much of the head's ProcessBench F1 is the draw of its threshold? On the saved features of the third
pass (``features.py``), the chosen recipe (block 10, mean pooling, ProcessBench-shaped training rows, L2 1.0)
is trained once per seed and its threshold chosen two ways, both on our own labels only:

* ``slice``: one held-out slice of 20% of the problems (the product's rule up to the fourth pass);
* ``cv5``: the out-of-fold scores of every problem, five heads each trained without one fold
  (``prm_head.out_of_fold_scores``); the final head is trained on every problem.

The seed draws the held-out slice or the folds (and the heads' initialisation). ProcessBench GSM8K is
only reported.

    OMP_NUM_THREADS=1 .venv/bin/python -m experiments.prm_head.threshold_draws /tmp/prm_sweep.pkl --seeds 20
"""

from __future__ import annotations

import argparse
import csv
import pickle
import random
from pathlib import Path

import numpy as np

from experiments.prm_head.sweep import Variant, auc, pb_step_labels, transform
from tentalis_pipelines.evaluation.processbench import processbench_metrics
from tentalis_pipelines.reviewers.prm_head import (
    HeadConfig,
    choose_rule,
    out_of_fold_scores,
    score_steps,
    train_head,
)

RECIPE = Variant(layers=(10,), pooling="mean", data="pbstyle", weight_decay=1.0)


def read(r: dict, kind: str, layers: list[int], hidden: int) -> np.ndarray:
    """A row's features: the recipe's hidden state, its four surprise columns (``step_surprise``), or both."""
    parts = []
    if kind in ("hidden", "hidden+surprise"):
        parts.append(transform(r["features"], RECIPE, layers, hidden))
    if kind in ("surprise", "hidden+surprise"):
        parts.append(np.asarray(r["surprise"], dtype=np.float32).reshape(len(r["features"]), -1))
    return np.concatenate(parts, 1)


def draw(d: dict, how: str, seed: int, kind: str = "hidden") -> dict:
    layers, hidden = d["layers"], d["hidden"]
    config = HeadConfig(layer=10, weight_decay=RECIPE.weight_decay, seed=seed)
    rows = [r for src in ("ours", "ours_pbstyle") for r in d[src]]
    feats = [read(r, kind, layers, hidden) for r in rows]
    labels = [list(r["labels"][: len(r["features"])]) for r in rows]
    styled = [i >= len(d["ours"]) for i in range(len(rows))]

    def fit(idx):
        idx = [i for i in idx if len(feats[i])]
        return train_head(np.concatenate([feats[i] for i in idx]), np.concatenate([np.asarray(labels[i]) for i in idx]), config)

    if how == "slice":
        pids = sorted({r["problem_id"] for r in rows})
        random.Random(seed).shuffle(pids)
        held = set(pids[: int(len(pids) * 0.2)])
        head = fit([i for i, r in enumerate(rows) if styled[i] and r["problem_id"] not in held])
        val = [i for i, r in enumerate(rows) if r["problem_id"] in held]
        val_scores = score_steps(head, [feats[i] for i in val])
    else:
        val = list(range(len(rows)))
        val_scores = out_of_fold_scores(feats, labels, [r["problem_id"] for r in rows], config, folds=5, seed=seed, trains=styled)
        head = fit([i for i in range(len(rows)) if styled[i]])
    rule, held_f1 = choose_rule(val_scores, [rows[i]["first_error"] for i in val])
    pb = d["processbench"]
    pb_scores = score_steps(head, [read(r, kind, layers, hidden) for r in pb])
    m = processbench_metrics([r["label"] for r in pb], [rule.predict(s) for s in pb_scores])
    xs, ys = pb_step_labels(pb_scores, [r["label"] for r in pb])
    return {"features": kind, "threshold_from": how, "seed": seed, "pb_step_auc": round(auc(xs, ys), 3), "threshold": round(rule.threshold, 3), "held_out_f1": round(100 * held_f1, 1),
            "pb_err": round(100 * m.error_accuracy, 1), "pb_cor": round(100 * m.correct_accuracy, 1), "pb_f1": round(100 * m.f1, 1)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("features", type=Path)
    p.add_argument("--seeds", type=int, default=20)
    p.add_argument("--csv", type=Path, default=Path(__file__).resolve().parent / "threshold_draws.csv")
    p.add_argument("--features-kind", default="hidden", help="comma-separated: hidden | surprise | hidden+surprise "
                   "(surprise needs features.py --surprise)")
    p.add_argument("--how", default="slice,cv5", help="comma-separated: slice | cv5")
    args = p.parse_args(argv)
    with args.features.open("rb") as fh:
        d = pickle.load(fh)
    out = []
    for kind in args.features_kind.split(","):
        for how in args.how.split(","):
            for seed in range(args.seeds):
                out.append(draw(d, how, seed, kind))
                print(out[-1], flush=True)
            f1 = [r["pb_f1"] for r in out if r["threshold_from"] == how and r["features"] == kind]
            print(f"{kind} {how}: ProcessBench GSM8K F1 mean {np.mean(f1):.1f}, min {min(f1):.1f}, max {max(f1):.1f}, "
                  f"below 20 in {sum(x < 20 for x in f1)} of {len(f1)}", flush=True)
    with args.csv.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(out[0]))
        w.writeheader()
        w.writerows(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
