"""Round 8 probe: how much should the policy's own reviewed steps weigh when the hidden-state head is trained?

Round 7 added 196 consensus-labelled rollouts to about 1,640 GSM8K solutions and the head hardly moved on the
policy's steps (step AUC 0.713 against 0.696), while a head trained on rollouts alone reached 0.829. This probe
trains `tentalis prm train`'s default head (block 10, mean pooling, linear, pbstyle training rendering, 5-fold
cross-fitted threshold) on three GSM8K draws (600 problems each, seeds 0-2) plus rollouts, with each rollout step
weighted W (`prm_head.train_head(weights=)`), and the rollouts rendered as the product does (pbstyle) or also as
the policy writes them (plain). For each it reports what must-hold 1 asks (ProcessBench GSM8K F1, all 400 items,
at the threshold chosen on our labels) and what a step scorer needs (step AUC on the policy's steps of problems
no training rollout came from).

Rollouts for training: round 7's source run (task seeds 101-108) and the learning runs' rollouts of one half of
the problems (`own_steps.side` 0); the test: the learning runs' rollouts of the other half. The contamination
guard runs without its MiniLM tier here (exact and 13-gram tiers only), to save time.

With ``--source-only`` the training rollouts are round 7's source run's alone (196; what a home of its own
holds), weighted more.

Usage: python -m experiments.prm_step_scorer.rollout_weight [--runs /work/runs] [--cache /tmp/rw.pkl] [--source-only]
Writes rollout_weight.csv (rollout_weight_source.csv).
"""

from __future__ import annotations

import argparse
import csv
import pickle
import random
from pathlib import Path

import numpy as np

from experiments.prm_head.diagnose import auc as roc_auc
from experiments.prm_head.diagnose import first_error_steps
from experiments.prm_step_scorer.own_steps import HOMES, side
from tentalis_pipelines import contamination
from tentalis_pipelines.evaluation.processbench import load_processbench, processbench_metrics
from tentalis_pipelines.inference.models import resolve_model
from tentalis_pipelines.lakehouse import Lakehouse
from tentalis_pipelines.reviewers.prm_head import (
    HeadConfig,
    choose_rule,
    head_features,
    load_trunk,
    out_of_fold_scores,
    score_steps,
    train_head,
)
from tentalis_pipelines.reviewers.prm_labels import (
    build_label_set,
    load_gsm8k_train,
    processbench_items,
    processbench_style,
    screen_problems,
)
from tentalis_pipelines.reviewers.prm_reviewer import problem_group, rollout_labels
from tentalis_pipelines.settings import data_dir

HERE = Path(__file__).resolve().parent
DRAWS = (0, 1, 2)
WEIGHTS = (0.0, 1.0, 3.0, 10.0)
ROLLOUT_RENDERINGS = ("pbstyle", "both")


def features(runs: Path, cache: Path) -> dict:
    if cache.is_file():
        return pickle.loads(cache.read_bytes())
    root = data_dir()
    cfg = HeadConfig()
    trunk = load_trunk(resolve_model("embedded", runs / HOMES[0] / "models"), cfg.layer)

    def feats(sols):
        return head_features(trunk, [(s.problem, s.steps) for s in sols], cfg)

    items, _, _ = contamination.static_items(("gsm8k", "math500"), root, required=("gsm8k",))
    items += processbench_items(root, ["gsm8k", "math", "olympiadbench", "omnimath"])
    index = contamination.ContaminationIndex(items, cache.parent / "rw_contamination")
    out: dict = {"draws": {}}
    for d in DRAWS:
        clean = screen_problems(load_gsm8k_train(root / "gsm8k" / "train.jsonl", limit=600, seed=d), index, use_embeddings=False).clean
        sols = build_label_set(clean, seed=d)
        rng = random.Random(d)
        pb = [processbench_style(s, rng) for s in sols]
        out["draws"][d] = {"plain": (sols, feats(sols)), "pbstyle": (pb, feats(pb))}
        print(f"draw {d}: {len(sols)} solutions", flush=True)
    learn = [s for h in HOMES for s in rollout_labels(Lakehouse(runs / h / "lakehouse"))[0]]
    train_roll = rollout_labels(Lakehouse(runs / "prm7-src" / "lakehouse"))[0] + [s for s in learn if side(s.problem) == 0]
    test_roll = [s for s in learn if side(s.problem) == 1]
    assert not {s.problem for s in train_roll} & {s.problem for s in test_roll} - {s.problem for s in rollout_labels(Lakehouse(runs / "prm7-src" / "lakehouse"))[0]}
    rng = random.Random(0)
    pb_roll = [processbench_style(s, rng) for s in train_roll]
    out["rollouts"] = {"plain": (train_roll, feats(train_roll)), "pbstyle": (pb_roll, feats(pb_roll))}
    out["test"] = (test_roll, feats(test_roll))
    bench = load_processbench("gsm8k")
    out["processbench"] = ([s.label for s in bench], head_features(trunk, [(s.problem, list(s.steps)) for s in bench], cfg))
    cache.write_bytes(pickle.dumps(out))
    return out


def run(f: dict, draw: int, weight: float, roll_render: str, n_rollouts: int | None = None) -> dict:
    cfg = HeadConfig()
    g = f["draws"][draw]
    val, fv, trains, w = [], [], [], []
    for render in ("plain", "pbstyle"):  # the product: both renderings scored, pbstyle trains
        sols, ff = g[render]
        val += sols
        fv += ff
        trains += [render == "pbstyle"] * len(sols)
        w += [1.0] * len(sols)
    if weight > 0:
        for render in ("plain", "pbstyle"):
            sols, ff = (x[:n_rollouts] for x in f["rollouts"][render])
            val += sols
            fv += ff
            trains += [roll_render == "both" or render == roll_render] * len(sols)
            w += [weight] * len(sols)
    oof = out_of_fold_scores(fv, [s.labels for s in val], [problem_group(s) for s in val], cfg, folds=5, seed=draw, trains=trains, weights=w)
    rule, oof_f1 = choose_rule(oof, [s.first_error for s in val], cfg.rule)
    fit = [i for i, t in enumerate(trains) if t and len(fv[i])]
    head = train_head(np.concatenate([fv[i] for i in fit]), np.concatenate([np.asarray(val[i].labels[: len(fv[i])]) for i in fit]), cfg,
                      np.concatenate([np.full(len(fv[i]), w[i], dtype=np.float32) for i in fit]))
    labels, pbf = f["processbench"]
    pbs = score_steps(head, pbf)
    m = processbench_metrics(labels, [rule.predict(s) for s in pbs])
    xs, ys = first_error_steps(pbs, labels)
    test, tf = f["test"]
    ts = score_steps(head, tf)
    y = np.concatenate([np.asarray(s.labels[: len(x)]) for s, x in zip(test, tf) if len(x)])
    p = np.concatenate([np.asarray(v) for v, x in zip(ts, tf) if len(x)])
    return {"draw": draw, "rollouts": len(f["rollouts"]["plain"][0][:n_rollouts]) if weight > 0 else 0, "rollout_weight": weight, "rollout_renderings": roll_render if weight > 0 else "",
            "threshold": round(rule.threshold, 3), "oof_f1": round(100 * oof_f1, 1),
            "pb_err": round(100 * m.error_accuracy, 1), "pb_cor": round(100 * m.correct_accuracy, 1), "pb_f1": round(100 * m.f1, 1),
            "pb_step_auc": round(roc_auc(np.asarray(xs), np.asarray(ys)), 3), "policy_step_auc": round(roc_auc(p, y), 3),
            "policy_steps_flagged": round(float((p < rule.threshold).mean()), 3)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", default="/work/runs")
    ap.add_argument("--cache", default="/tmp/rw.pkl")
    ap.add_argument("--source-only", action="store_true")
    a = ap.parse_args()
    f = features(Path(a.runs), Path(a.cache))
    # round 7's source run's rollouts come first in the training rollouts (features())
    n = len(rollout_labels(Lakehouse(Path(a.runs) / "prm7-src" / "lakehouse"))[0]) if a.source_only else None
    weights = (10.0, 30.0, 100.0) if a.source_only else WEIGHTS
    print(f"rollouts for training: {len(f['rollouts']['plain'][0])}, test rollouts: {len(f['test'][0])}", flush=True)
    rows = []
    for d in DRAWS:
        for wgt in weights:
            for rr in ROLLOUT_RENDERINGS if wgt > 0 else ("",):
                rows.append(run(f, d, wgt, rr, n))
                print(rows[-1], flush=True)
    with open(HERE / ("rollout_weight_source.csv" if a.source_only else "rollout_weight.csv"), "w", newline="") as fh:
        wr = csv.DictWriter(fh, fieldnames=list(rows[0]))
        wr.writeheader()
        wr.writerows(rows)


if __name__ == "__main__":
    main()
