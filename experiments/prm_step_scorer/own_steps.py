"""How well does a head tell right from wrong on the policy's own arithmetic steps, and on problems it never saw?

The consensus labels of every round's reviewed rollouts (`prm_reviewer.rollout_labels`: calculator, verifier)
are split by problem text (a stable hash: no problem on both sides). A head trained on one half (hidden state,
and hidden + surprise) is scored on the other, beside the GSM8K-trained heads of `prm_head/e2e.sh` (round 2's
surprise head, round 3's hidden-state head) and round 7's (`round7_source.sh`: GSM8K and its own run's rollouts,
on task seeds 101-108). Step-level ROC AUC; writes own_steps.csv.

Usage: python -m experiments.prm_step_scorer.own_steps [--runs /work/runs]
"""

from __future__ import annotations

import argparse
import csv
import hashlib
from pathlib import Path

import numpy as np

from experiments.prm_head.diagnose import auc as roc_auc
from tentalis_pipelines.inference.models import resolve_model
from tentalis_pipelines.lakehouse import Lakehouse
from tentalis_pipelines.reviewers.prm_head import (
    HeadCheckpoint,
    HeadConfig,
    head_features,
    load_trunk,
    score_steps,
    train_head,
)
from tentalis_pipelines.reviewers.prm_reviewer import rollout_labels

HERE = Path(__file__).resolve().parent
HOMES = ["calculator2_s0", "calculator2_s1", "calculator6_s0", "calculator6_s1", "prm5_s0", "prm5_s1", "calculator_s0", "calculator_s1",
         "calculator_s2"]
GSM8K_HEADS = {"surprise, GSM8K only (round 2)": "prm-e2e-s0-ndefault", "hidden, GSM8K only (round 3)": "prm-e2e-s0-ndefault-hidden",
               "hidden, GSM8K + 196 rollouts of other problems (round 7)": "prm7-src"}


def side(problem: str) -> int:
    return int(hashlib.sha1(problem.encode()).hexdigest(), 16) % 2


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", default="/work/runs")
    runs = Path(ap.parse_args().runs)
    sols = [s for h in HOMES for s in rollout_labels(Lakehouse(runs / h / "lakehouse"))[0]]
    train, test = [s for s in sols if side(s.problem) == 0], [s for s in sols if side(s.problem) == 1]
    assert not {s.problem for s in train} & {s.problem for s in test}
    trunk = load_trunk(resolve_model("embedded", runs / HOMES[0] / "models"), 10, full=True)

    def auc(head, cfg, part) -> float:
        f = head_features(trunk, [(s.problem, s.steps) for s in part], cfg)
        y = np.concatenate([np.asarray(s.labels[: len(x)]) for s, x in zip(part, f) if len(x)])
        p = np.concatenate([np.asarray(v) for v, x in zip(score_steps(head, f), f) if len(x)])
        return round(roc_auc(p, y), 3)  # ties count as misses, as in prm_head's diagnosis

    rows = []
    for feats in ("hidden", "hidden+surprise"):
        cfg = HeadConfig(features=feats)
        f = head_features(trunk, [(s.problem, s.steps) for s in train], cfg)
        x = np.concatenate([a for a in f if len(a)])
        y = np.concatenate([np.asarray(s.labels[: len(a)]) for s, a in zip(train, f) if len(a)])
        head = train_head(x, y, cfg)
        rows.append({"head": f"{feats}, the other half's rollouts", "auc_unseen_problems": auc(head, cfg, test), "auc_own_training_steps": auc(head, cfg, train)})
    for name, home in GSM8K_HEADS.items():
        ck = HeadCheckpoint.load(runs / home / "reviewers" / "prm_head" / "v0001")
        rows.append({"head": name, "auc_unseen_problems": auc(ck.head, ck.config, test), "auc_own_training_steps": None})
    meta = {"train_problems": len({s.problem for s in train}), "train_steps": sum(len(s.labels) for s in train),
            "test_problems": len({s.problem for s in test}), "test_steps": sum(len(s.labels) for s in test),
            "test_correct_steps": sum(sum(s.labels) for s in test)}
    with open(HERE / "own_steps.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=["head", "auc_unseen_problems", "auc_own_training_steps", *meta])
        w.writeheader()
        w.writerows({**r, **meta} for r in rows)
    for r in rows:
        print(r)
    print(meta)


if __name__ == "__main__":
    main()
