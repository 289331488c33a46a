"""Does the dense hint reward predict what a hint really does?

For each group of the base model's samples in which every sample failed, the pipeline's own
``guided_rollouts`` stage picks the group's hint, resamples the group with it, and stores the hint's dense
reward (``rewards/hint_reward.py``: log p(answer | prompt + hint) - log p(answer | prompt)). The realised
efficacy of the hint is its rescue rate: the share of hinted samples the verifier accepts (the unhinted
group's was 0 by construction). This script collects such groups from fresh level-1 arithmetic batches
and reports Spearman's rank correlation between the two with a bootstrap 95% interval (groups resampled).

    .venv/bin/python -m experiments.guided_resampling.hint_reward collect --batches 4 --num-tasks 64
    .venv/bin/python -m experiments.guided_resampling.hint_reward rescore --homes H1 H2 --out hint_reward_v2.csv
    .venv/bin/python -m experiments.guided_resampling.hint_reward summarize --out hint_reward_v2.csv

``rescore`` recomputes every collected group's dense reward with the current definition (the stored one is
the definition the collection ran with) under the base model; ``rescue_rate`` does not change. With
``--solution`` it scores the task's reference solution (its steps and value, ``HintQuery.steps``: v3)
instead of the answer's value alone (v2).

    .venv/bin/python -m experiments.guided_resampling.hint_reward rescore --solution --homes H1 H2 --out hint_reward_v3.csv
"""

from __future__ import annotations

import argparse
import csv
import os
import random
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
CSV = HERE / "hint_reward.csv"
FIELDS = ["source", "batch_id", "task_id", "policy_version", "hint_kind", "hint", "hint_reward", "samples", "successes",
          "rescue_rate"]


def collect(args) -> None:
    from tentalis_pipelines.efficacy import hint_kind
    from tentalis_pipelines.lakehouse import Lakehouse
    from tentalis_pipelines.policy import PolicySettings
    from tentalis_pipelines.settings import Paths
    from tentalis_pipelines.stages.guided_rollouts import build_guided_rollouts
    from tentalis_pipelines.stages.reviews import build_reviews
    from tentalis_pipelines.stages.rollouts import build_rollouts
    from tentalis_pipelines.stages.step_scores import build_step_scores
    from tentalis_pipelines.stages.tasks import build_tasks
    from tentalis_pipelines.tasks.batches import register_generated_batch
    from tentalis_pipelines.training.trainer import GRPOConfig

    home = Path(args.home or tempfile.mkdtemp(prefix="tentalis-hint-reward-"))
    paths = Paths.from_env(home).ensure()
    lake = Lakehouse(paths.lakehouse)
    policy = PolicySettings(num_generations=args.num_generations, max_new_tokens=96, temperature=0.8, seed=args.seed)
    config = GRPOConfig(guide=True, guide_generations=args.guide_generations)
    backend = None
    rows = []
    for b in range(args.batches):
        t0 = time.time()
        batch_id = register_generated_batch(paths.batches, seed=args.first_seed + b, num_tasks=args.num_tasks, levels=(1,))
        build_tasks(lake, paths, batch_id, policy)
        if backend is None:
            from tentalis_pipelines.inference.models import resolve_model

            backend = policy.make_backend(resolve_model(policy.model, paths.models))
        build_rollouts(lake, paths, batch_id, policy, backend)
        build_step_scores(lake, batch_id)
        build_reviews(lake, batch_id)
        res = build_guided_rollouts(lake, paths, batch_id, policy, config, backends={"base": backend})
        guided = lake.read("guided_rollouts", batch_id=batch_id).to_pylist()
        for task_id in sorted({g["task_id"] for g in guided}):
            group = [g for g in guided if g["task_id"] == task_id]
            ok = sum(g["correct"] for g in group)
            rows.append({"source": "base", "batch_id": batch_id, "task_id": task_id, "policy_version": group[0]["policy_version"],
                         "hint_kind": hint_kind(group[0]["hint"]), "hint": group[0]["hint"], "hint_reward": group[0]["hint_reward"],
                         "samples": len(group), "successes": ok, "rescue_rate": ok / len(group)})
        print(f"{batch_id}: {res.metadata['all_fail_groups']} all-fail groups, {res.metadata['rescued_groups']} rescued, "
              f"{time.time() - t0:.0f} s", flush=True)
        _write(rows, Path(args.out))
    print(f"{len(rows)} hinted groups -> {args.out} (home {home})")


def rescore(args) -> None:
    from tentalis_pipelines.efficacy import hint_kind
    from tentalis_pipelines.inference.models import resolve_model
    from tentalis_pipelines.lakehouse import Lakehouse
    from tentalis_pipelines.policy import PolicySettings
    from tentalis_pipelines.rewards.hint_reward import HintQuery, hint_rewards, solution_steps
    from tentalis_pipelines.settings import Paths

    rows, backend = [], None
    for h in args.homes:
        paths = Paths.from_env(Path(h))
        lake = Lakehouse(paths.lakehouse)
        if backend is None:
            backend = PolicySettings().make_backend(resolve_model("embedded", paths.models))
        tasks = {(t["batch_id"], t["task_id"]): t for t in lake.read("tasks").to_pylist()}
        guided = lake.read("guided_rollouts").to_pylist()
        groups = sorted({(g["batch_id"], g["task_id"]) for g in guided})
        firsts = [next(g for g in guided if (g["batch_id"], g["task_id"]) == k and g["group_index"] == 0) for k in groups]
        dense = hint_rewards(backend.model, backend.tokenizer,
                             [HintQuery(g["prompt_text"], tasks[k]["prompt"], g["hint"], tasks[k]["reference"],
                                        solution_steps(tasks[k]) if args.solution else ())
                              for k, g in zip(groups, firsts)], dtype="auto")
        for k, g, d in zip(groups, firsts, dense):
            members = [x for x in guided if (x["batch_id"], x["task_id"]) == k]
            ok = sum(x["correct"] for x in members)
            rows.append({"source": "base", "batch_id": k[0], "task_id": k[1], "policy_version": g["policy_version"],
                         "hint_kind": hint_kind(g["hint"]), "hint": g["hint"], "hint_reward": d.reward, "samples": len(members),
                         "successes": ok, "rescue_rate": ok / len(members)})
        print(f"{h}: {len(groups)} groups rescored", flush=True)
    _write(rows, Path(args.out[0]))


def _write(rows: list[dict], out: Path) -> None:
    with out.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=FIELDS)
        w.writeheader()
        w.writerows(rows)


def spearman(x: list[float], y: list[float]) -> float:
    """Spearman's rho (the product's, ``rewards/agreement.py``); nan when undefined."""
    from tentalis_pipelines.rewards.agreement import spearman as rho

    v = rho(x, y)
    return float("nan") if v is None else v


def bootstrap_ci(x: list[float], y: list[float], n: int = 2000, seed: int = 0) -> tuple[float, float]:
    rng = random.Random(seed)
    stats = []
    idx = range(len(x))
    for _ in range(n):
        s = [rng.choice(idx) for _ in idx]
        v = spearman([x[i] for i in s], [y[i] for i in s])
        if v == v:  # not nan
            stats.append(v)
    stats.sort()
    return stats[int(0.025 * len(stats))], stats[int(0.975 * len(stats)) - 1]


def summarize(args) -> None:
    rows = []
    for out in args.out:
        with Path(out).open() as fh:
            rows += [r for r in csv.DictReader(fh) if r["hint_reward"] not in ("", "None")]
    x = [float(r["hint_reward"]) for r in rows]
    y = [float(r["rescue_rate"]) for r in rows]
    rho = spearman(x, y)
    lo, hi = bootstrap_ci(x, y)
    print(f"{len(rows)} hinted groups: Spearman rho(hint_reward, rescue rate) = {rho:+.3f}, 95% bootstrap CI [{lo:+.3f}, {hi:+.3f}]")
    for kind in sorted({r["hint_kind"] for r in rows}):
        sub = [r for r in rows if r["hint_kind"] == kind]
        if len(sub) >= 5:
            sx, sy = [float(r["hint_reward"]) for r in sub], [float(r["rescue_rate"]) for r in sub]
            print(f"  {kind}: n={len(sub)}, rho={spearman(sx, sy):+.3f}, mean reward {sum(sx) / len(sx):+.3f}, "
                  f"mean rescue {sum(sy) / len(sy):.3f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("collect")
    c.add_argument("--batches", type=int, default=4)
    c.add_argument("--num-tasks", type=int, default=64)
    c.add_argument("--num-generations", type=int, default=4)
    c.add_argument("--guide-generations", type=int, default=4)
    c.add_argument("--first-seed", type=int, default=5000)
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--home", default=None)
    c.add_argument("--out", default=str(CSV))
    r = sub.add_parser("rescore")
    r.add_argument("--homes", nargs="+", required=True)
    r.add_argument("--out", nargs=1, default=[str(HERE / "hint_reward_v2.csv")])
    r.add_argument("--solution", action="store_true", help="score the reference solution's steps and value (v3)")
    s = sub.add_parser("summarize")
    s.add_argument("--out", nargs="+", default=[str(CSV)], help="one or more collect CSVs, pooled")
    args = ap.parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    {"collect": collect, "rescore": rescore, "summarize": summarize}[args.cmd](args)


if __name__ == "__main__":
    main()
