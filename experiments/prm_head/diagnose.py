"""Diagnosis of a run's saved features (``run.py --features F``): per layer and head width, the held-out and
ProcessBench GSM8K step AUC, the F1 at the held-out threshold, the score quantiles, and, for diagnosis
only, the F1 that a threshold chosen on ProcessBench itself would give (never used to report the head).

    .venv/bin/python -m experiments.prm_head.diagnose /tmp/prm_features.pkl
"""

from __future__ import annotations

import pickle
import sys

import numpy as np

from tentalis_pipelines.evaluation.processbench import processbench_metrics
from tentalis_pipelines.reviewers.prm_head import (
    HeadConfig,
    choose_threshold,
    first_error,
    score_steps,
    train_head,
)


def auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """P(a correct step scores above a wrong one)."""
    pos, neg = scores[labels == 1], scores[labels == 0]
    return float((pos[:, None] > neg[None, :]).mean())


def first_error_steps(scores, first_errors):
    """Steps before the first error (1) and the first wrong step (0), ProcessBench's known step labels."""
    xs, ys = [], []
    for s, lab in zip(scores, first_errors):
        for i, x in enumerate(s):
            if lab == -1 or i < lab:
                xs.append(x)
                ys.append(1)
            elif i == lab:
                xs.append(x)
                ys.append(0)
    return np.asarray(xs), np.asarray(ys)


def main(path: str) -> None:
    with open(path, "rb") as fh:
        d = pickle.load(fh)
    pb = d["processbench"]["gsm8k"]
    for hidden in (0, 32):
        for li, layer in enumerate(d["layers"]):
            x = np.concatenate([f[:, li].astype(np.float32) for _, _, f in d["train"] if len(f)])
            y = np.concatenate([np.asarray(lab[: len(f)]) for _, lab, f in d["train"] if len(f)])
            head = train_head(x, y, HeadConfig(layer=layer, hidden=hidden, lr=1e-2 if hidden == 0 else 3e-3))
            val = score_steps(head, [f[:, li].astype(np.float32) for _, _, f in d["val"]])
            t, f1_val = choose_threshold(val, [fe for fe, _, _ in d["val"]])
            val_auc = auc(np.concatenate([np.asarray(s) for s in val]),
                          np.concatenate([np.asarray(lab[: len(f)]) for _, lab, f in d["val"]]))
            sp = score_steps(head, [f[:, li].astype(np.float32) for f in pb["features"]])
            m = processbench_metrics(pb["labels"], [first_error(s, t) for s in sp])
            _, f1_oracle = choose_threshold(sp, pb["labels"])
            xs, ys = first_error_steps(sp, pb["labels"])
            print(f"hidden {hidden} layer {layer}: held-out F1 {100 * f1_val:.1f}, step AUC {val_auc:.3f}, threshold {t:.3f} | "
                  f"ProcessBench F1 {100 * m.f1:.1f} (err {100 * m.error_accuracy:.1f}, cor {100 * m.correct_accuracy:.1f}), "
                  f"step AUC {auc(xs, ys):.3f} | threshold chosen on ProcessBench (diagnosis only): F1 {100 * f1_oracle:.1f}")
            print("   score quantiles 10/50/90 %: correct steps", np.round(np.quantile(xs[ys == 1], [0.1, 0.5, 0.9]), 3),
                  "first wrong steps", np.round(np.quantile(xs[ys == 0], [0.1, 0.5, 0.9]), 3))


if __name__ == "__main__":
    main(sys.argv[1])
