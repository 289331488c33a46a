"""Why the surprise head is gamed: do the four surprise statistics tell the policy's own right steps from wrong ones?

Raw step AUC (no head) of each `prm_head.step_surprise` column (mean and min log-prob of the step's tokens, and of
its digit tokens) on the consensus-labelled rollouts of the learning runs' unseen half (`own_steps.side` 1) and on
round 4's rollouts (the surprise head's own learning runs). Prints one line per set.

Usage: python -m experiments.prm_step_scorer.surprise_own_steps [--runs /work/runs]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from experiments.prm_head.diagnose import auc as roc_auc
from experiments.prm_step_scorer.own_steps import HOMES, side
from tentalis_pipelines.inference.models import resolve_model
from tentalis_pipelines.lakehouse import Lakehouse
from tentalis_pipelines.reviewers.prm_head import SURPRISE_FEATURES, load_trunk, step_features_and_surprise
from tentalis_pipelines.reviewers.prm_reviewer import rollout_labels


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", default="/work/runs")
    runs = Path(ap.parse_args().runs)
    trunk = load_trunk(resolve_model("embedded", runs / HOMES[0] / "models"), 10, full=True)

    def probe(name, sols):
        _, u = step_features_and_surprise(trunk, [(s.problem, s.steps) for s in sols], max_tokens=1024, layers=(10,), pooling="mean",
                                          surprise=True)
        y = np.concatenate([np.asarray(s.labels[: len(x)]) for s, x in zip(sols, u) if len(x)])
        x = np.concatenate([x for x in u if len(x)])
        print(name, "steps", len(y), "correct", int(y.sum()), {f: round(roc_auc(x[:, i], y), 3) for i, f in enumerate(SURPRISE_FEATURES)}, flush=True)

    sols = [s for h in HOMES for s in rollout_labels(Lakehouse(runs / h / "lakehouse"))[0]]
    probe("learning runs, unseen half", [s for s in sols if side(s.problem) == 1])
    for h in ("prm4_s0", "prm4_s1"):
        probe(h, rollout_labels(Lakehouse(runs / h / "lakehouse"))[0])


if __name__ == "__main__":
    main()
