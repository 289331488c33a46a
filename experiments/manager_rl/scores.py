"""The manager's scores on the rollouts it reviewed during guided learning, against the verifier's.

Round 7's check of must-hold 3's second half ("its scores agree with the verifier at least as well as
before") on the worker's own rollouts: every ``llm`` review of a ``tentalis learn`` home (64 a cycle) is
compared with the verifier's score of the same rollout. Per arm and cycle (summed over seeds): the
class-balanced score error (``manager_rl.balanced_score_error``) and the score gap between accepted answers
and failures (``manager_rl.score_separation``), each with a 95% bootstrap interval that draws rollouts
within each class.

Usage: python -m experiments.manager_rl.scores [--runs /work/runs] [--seeds 0,1,2,3] [--cycles 2,3,4] [--against mgr5-base]
       mgr5-base mgr7-cotrain ...
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from experiments.manager_rl.guided import cycle_of
from tentalis_pipelines.lakehouse import Lakehouse
from tentalis_pipelines.rewards.llm_manager import FALLBACK_CRITIQUE as FALLBACK
from tentalis_pipelines.rewards.managers import VerifierManager
from tentalis_pipelines.stages.reviews import review_inputs
from tentalis_pipelines.training.manager_rl import balanced_score_error, score_separation


def reviewed(runs: Path, arm: str, seeds, cycles):
    """(lake, rollout row, ReviewInput, its llm review row) for every llm review of the arm's homes in the given
    cycles, batch by batch in order."""
    for s in seeds:
        home = runs / f"{arm}-s{s}" / "lakehouse"
        if not home.exists():
            continue
        lake = Lakehouse(home)
        # the llm manager's reviews, and its unparseable replies (stored as manager 'llm' before the fallback
        # was named the verifier's, as 'verifier' since: the critique marks both)
        reviews = {r["rollout_id"]: r for r in lake.read("reviews").to_pylist()
                   if r["manager"] == "llm" or (r["critique"] or "").startswith(FALLBACK)}
        for batch_id in sorted({r["batch_id"] for r in reviews.values()}):
            if cycle_of(batch_id) not in cycles:
                continue
            for r, x in review_inputs(lake, batch_id):
                if r["rollout_id"] in reviews:
                    yield lake, r, x, reviews[r["rollout_id"]]


def arm_rows(runs: Path, arm: str, seeds, cycles, *, own: bool = False) -> list[tuple[float | None, float, bool]]:
    """(manager score, verifier score, accepted) for every llm review of the arm's homes in the given cycles.
    ``own``: a review whose reply did not parse, which the loop records with the verifier's own score, counts
    as no score (error 1, left out of the gap, as the gate counts an unparseable score), so the verifier's
    scores are not credited to the manager."""
    verifier = VerifierManager()
    return [(None if own and (rev["critique"] or "").startswith(FALLBACK) else rev["score"], verifier.review(x).score, x.correct)
            for _, _, x, rev in reviewed(runs, arm, seeds, cycles)]


def draw_within_class(rows, rng):
    """One bootstrap draw of ``rows``: rollouts with replacement within each class (failures, accepted answers)."""
    classes = [[r for r in rows if r[2] == flag] for flag in (False, True)]
    return [c[i] for c in classes if c for i in rng.integers(0, len(c), len(c))]


def interval(rows, stat, *, n_boot: int = 2000, seed: int = 0) -> tuple[float, float]:
    """95% bootstrap interval of ``stat`` drawing rollouts with replacement within each class."""
    rng = np.random.default_rng(seed)
    reps = [v for v in (stat(draw_within_class(rows, rng)) for _ in range(n_boot)) if v is not None]
    return float(np.quantile(reps, 0.025)), float(np.quantile(reps, 0.975))


def difference_interval(rows, other, stat, *, n_boot: int = 2000, seed: int = 0) -> tuple[float, float]:
    """95% interval of ``stat(rows) - stat(other)`` for two arms' reviews of different rollouts: each arm drawn
    independently, within class (the arms' workers wrote different rollouts, so nothing pairs them)."""
    rng = np.random.default_rng(seed)
    reps = []
    for _ in range(n_boot):
        a, b = stat(draw_within_class(rows, rng)), stat(draw_within_class(other, rng))
        if a is not None and b is not None:
            reps.append(a - b)
    return float(np.quantile(reps, 0.025)), float(np.quantile(reps, 0.975))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", default="/work/runs")
    ap.add_argument("--seeds", default="0,1,2,3")
    ap.add_argument("--cycles", default="2,3,4")
    ap.add_argument("--against", default=None, help="also each arm's difference from this arm (e.g. mgr5-base)")
    ap.add_argument("--own", action="store_true", help="the manager's own scores: a review that fell back to the "
                    "verifier's (its reply did not parse) counts as no score")
    ap.add_argument("arms", nargs="+")
    args = ap.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    cycles = {int(c) for c in args.cycles.split(",")}
    for arm in args.arms:
        rows = arm_rows(Path(args.runs), arm, seeds, cycles, own=args.own)
        acc = sum(r[2] for r in rows)
        err, gap = balanced_score_error(rows), score_separation(rows)
        lo, hi = interval(rows, balanced_score_error)
        glo, ghi = interval(rows, score_separation)
        print(f"{arm} cycles {args.cycles}: {len(rows)} reviews ({acc} accepted); class-balanced score error {err:.3f} "
              f"[{lo:.3f}, {hi:.3f}]; score gap {gap:+.3f} [{glo:+.3f}, {ghi:+.3f}]")
        if args.against and arm != args.against:
            ref = arm_rows(Path(args.runs), args.against, seeds, cycles, own=args.own)
            dlo, dhi = difference_interval(rows, ref, balanced_score_error)
            glo, ghi = difference_interval(rows, ref, score_separation)
            print(f"  minus {args.against}: score error {err - balanced_score_error(ref):+.3f} [{dlo:+.3f}, {dhi:+.3f}]; "
                  f"score gap {gap - score_separation(ref):+.3f} [{glo:+.3f}, {ghi:+.3f}]")


if __name__ == "__main__":
    main()
