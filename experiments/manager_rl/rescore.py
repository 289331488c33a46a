"""Each manager's greedy scores on the same rollouts, paired: must-hold 3's score clause without the worker.

`scores.py` compares managers on the rollouts of their own worker runs, which differ between arms, so its
intervals draw each arm on its own. Here every manager checkpoint re-reviews one arm's worker rollouts (the
cycles given, every seed), greedily, as the loop's llm manager does (`ReviewResource.llm_manager`, the same
hint prefix), so the comparison pairs by rollout: the class-balanced score error and the score gap of each
manager, and each one's difference from the first listed (a 95% bootstrap over rollouts within class, the
same draw for both). The first manager is usually 'base', whose re-review of the untrained arm must
reproduce the stored reviews (printed as a check). Only the reviews' first pass runs (up to the score and
critique: the hint pass does not change the score), on every accepted answer and ``--failures`` failures
drawn with a fixed seed: a 400-token prompt costs about 2 s of prefill on one core, so all 384 rollouts of
two seeds' cycles 2-4 with the hint pass take about half an hour a manager.

Usage: python -m experiments.manager_rl.rescore --arm mgr15-base --seeds 0,1 --cycles 2,3,4 \
           --manager-home /work/runs/mgr15-exp --hint-prefix "First compute" base m-725aca102271
"""

from __future__ import annotations

import argparse
import collections
from pathlib import Path

import numpy as np

from assets.resources import ReviewResource
from experiments.manager_rl.scores import reviewed
from tentalis_pipelines.inference.base import SamplingParams
from tentalis_pipelines.lakehouse import Lakehouse
from tentalis_pipelines.rewards.llm_manager import bound_by_ground_truth, first_pass_stops, parse_reply
from tentalis_pipelines.rewards.managers import VerifierManager
from tentalis_pipelines.training.manager_rl import balanced_score_error, score_separation


def arm_items(runs: Path, arm: str, seeds, cycles):
    """(task prompt, completion, ReviewInput, stored llm score) for every llm-reviewed rollout of the arm's homes."""
    prompts: dict[tuple[int, str], str] = {}  # (lake, task id): the task's prompt, read once a lake
    items = []
    for lake, r, x, rev in reviewed(runs, arm, seeds, cycles):
        if (id(lake), r["task_id"]) not in prompts:
            prompts.update({(id(lake), t["task_id"]): t["prompt"] for t in lake.read("tasks").to_pylist()})
        items.append((prompts[id(lake), r["task_id"]], r["completion"], x, rev["score"]))
    return items


def adapter_of(manager_home: Path, checkpoint: str) -> str | None:
    if checkpoint == "base":
        return None
    rows = Lakehouse(manager_home / "lakehouse").read("manager_checkpoints").to_pylist()
    return next(r["adapter_uri"] for r in rows if r["checkpoint_id"] == checkpoint)


def first_pass_scores(mgr, items, *, raw: bool = False) -> list[float | None]:
    """The score of each review as ``LLMManager.review_many`` writes it, from its first greedy pass alone (an
    unparseable reply: None; the loop would fall back to the verifier's review). ``raw``: the score as the
    manager wrote it, before ``bound_by_ground_truth`` caps a wrong answer's."""
    prompts = [mgr.prompt(t, c, x) for t, c, x, _ in items]
    params = SamplingParams(num_generations=1, max_new_tokens=mgr.max_new_tokens, temperature=0.0, seed=mgr.seed,
                            stop=first_pass_stops(mgr.hint_prefix))
    out = []
    for (_, _, x, _), gens in zip(items, mgr.backend.generate(prompts, params)):
        p = parse_reply(gens[0].text)
        out.append(None if p is None else p[0] if raw else bound_by_ground_truth(p[0], x))
    return out


def stats(rows) -> tuple[float, float | None]:
    return balanced_score_error(rows), score_separation(rows)


def paired_difference(a, b, stat, *, n_boot: int = 2000, seed: int = 0) -> tuple[float, float]:
    """95% interval of stat(a) - stat(b), ``a`` and ``b`` rows of the same rollouts in the same order: one draw
    of rollout indices within class serves both."""
    rng = np.random.default_rng(seed)
    classes = [[i for i, r in enumerate(a) if r[2] == flag] for flag in (False, True)]
    reps = []
    for _ in range(n_boot):
        idx = [c[j] for c in classes if c for j in rng.integers(0, len(c), len(c))]
        x, y = stat([a[i] for i in idx]), stat([b[i] for i in idx])
        if x is not None and y is not None:
            reps.append(x - y)
    return float(np.quantile(reps, 0.025)), float(np.quantile(reps, 0.975))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=Path, default=Path("/work/runs"))
    ap.add_argument("--arm", required=True, help="the homes whose rollouts are re-reviewed: RUNS/ARM-sS")
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--cycles", default="2,3,4")
    ap.add_argument("--manager-home", type=Path, required=True, help="the home whose manager_checkpoints hold the checkpoints")
    ap.add_argument("--hint-prefix", default="")
    ap.add_argument("--raw", action="store_true", help="the scores as written, before the cap on a wrong answer's")
    ap.add_argument("--failures", type=int, default=96, help="failures re-reviewed (drawn with seed 0); every accepted answer is")
    ap.add_argument("checkpoints", nargs="+", help="manager checkpoint ids or 'base'; the first is the reference")
    args = ap.parse_args()
    items = arm_items(args.runs, args.arm, [int(s) for s in args.seeds.split(",")], {int(c) for c in args.cycles.split(",")})
    rng = np.random.default_rng(0)
    failed = [i for i, it in enumerate(items) if not it[2].correct]
    keep = set(rng.choice(failed, size=min(args.failures, len(failed)), replace=False).tolist()) | {
        i for i, it in enumerate(items) if it[2].correct}
    items = [it for i, it in enumerate(items) if i in keep]
    verifier = VerifierManager()
    truth = [(verifier.review(x).score, x.correct) for _, _, x, _ in items]
    print(f"{args.arm} seeds {args.seeds} cycles {args.cycles}: {len(items)} rollouts, {sum(c for _, c in truth)} accepted")
    resource = ReviewResource(hint_prefix=args.hint_prefix)
    rows = {}
    for cid in args.checkpoints:
        mgr = resource.llm_manager(args.manager_home / "models", adapter_dir=adapter_of(args.manager_home, cid), version=cid)
        scores = first_pass_scores(mgr, items, raw=args.raw)
        rows[cid] = [(sc, v, ok) for sc, (v, ok) in zip(scores, truth)]
        same = sum(sc == s for sc, (_, _, _, s) in zip(scores, items))
        err, gap = stats(rows[cid])
        by = {flag: collections.Counter(r[0] for r in rows[cid] if r[2] == flag).most_common(4) for flag in (True, False)}
        print(f"{cid}: class-balanced score error {err:.3f}, score gap {gap:+.3f}; equal to the stored score on {same} of "
              f"{len(items)}; accepted {by[True]}, failed {by[False]}")
    ref = args.checkpoints[0]
    for cid in args.checkpoints[1:]:
        e, g = stats(rows[cid]), stats(rows[ref])
        ei = paired_difference(rows[cid], rows[ref], balanced_score_error)
        gi = paired_difference(rows[cid], rows[ref], score_separation)
        print(f"{cid} minus {ref} (paired by rollout): score error {e[0] - g[0]:+.3f} [{ei[0]:+.3f}, {ei[1]:+.3f}]; "
              f"score gap {e[1] - g[1]:+.3f} [{gi[0]:+.3f}, {gi[1]:+.3f}]")


if __name__ == "__main__":
    main()
