"""Where guidance's signal went, per worker arm: the guided samples the verifier accepted, the hinted groups,
and the groups whose hint names the task's solution expression (``plans.names_expression``) with their rescues.

Reads ``guided_rollouts`` of ``$RUNS/{arm}-s{0..3}`` (the homes of ``run.sh worker``).

``--by-cycle``: the same per learning cycle (the batch's generator seed, ``arith-sK-…``, is cycle K of a
``tentalis learn`` home), summed over the seeds, with the groups whose hint is the generic ``…the answer to the question``.

Usage: python -m experiments.manager_rl.guided [--runs /work/runs] [--seeds 0,1,2,3] [--by-cycle] mgr5-base mgr6-trained ...
"""

from __future__ import annotations

import argparse
from pathlib import Path

from experiments.manager_rl.plans import expressions, names_expression
from tentalis_pipelines.lakehouse import Lakehouse


def arm_stats(runs: Path, arm: str, seeds=range(4)) -> dict[str, int]:
    tot = {"samples": 0, "rescued": 0, "groups": 0, "plan_groups": 0, "rescued_groups": 0, "plan_rescued": 0}
    for s in seeds:
        home = runs / f"{arm}-s{s}" / "lakehouse"
        if not home.exists():
            continue
        lake = Lakehouse(home)
        if not lake.exists("guided_rollouts"):
            continue
        g = lake.read("guided_rollouts").to_pylist()
        ex = expressions(lake)
        groups = {(r["batch_id"], r["hint_id"]) for r in g}
        plans = {(r["batch_id"], r["hint_id"]) for r in g if names_expression(r["hint"], ex.get(r["task_id"]))}
        tot["samples"] += len(g)
        tot["rescued"] += sum(r["correct"] for r in g)
        tot["groups"] += len(groups)
        tot["plan_groups"] += len(plans)
        tot["rescued_groups"] += len({(r["batch_id"], r["hint_id"]) for r in g if r["correct"]})
        tot["plan_rescued"] += sum(r["correct"] for r in g if (r["batch_id"], r["hint_id"]) in plans)
    return tot


GENERIC = "the answer to the question"


def cycle_of(batch_id: str) -> int:
    """The learning cycle of a ``tentalis learn`` home's batch: its generator seed (``arith-sK-…`` is cycle K)."""
    return int(batch_id.split("-")[1].lstrip("s"))


def by_cycle(runs: Path, arm: str, seeds) -> dict[int, dict[str, int]]:
    """Per cycle, over the seeds: guided samples, rescued ones, hinted groups, plan groups, generic-hint groups."""
    out: dict[int, dict[str, int]] = {}
    for s in seeds:
        home = runs / f"{arm}-s{s}" / "lakehouse"
        if not home.exists() or not Lakehouse(home).exists("guided_rollouts"):
            continue
        lake = Lakehouse(home)
        ex = expressions(lake)
        for r in lake.read("guided_rollouts").to_pylist():
            k = cycle_of(r["batch_id"])
            c = out.setdefault(k, {"samples": 0, "rescued": 0, "groups": set(), "plans": set(), "generic": set()})
            key = (s, r["batch_id"], r["hint_id"])
            c["samples"] += 1
            c["rescued"] += bool(r["correct"])
            c["groups"].add(key)
            if names_expression(r["hint"], ex.get(r["task_id"])):
                c["plans"].add(key)
            if GENERIC in r["hint"]:
                c["generic"].add(key)
    return {k: {n: (len(v) if isinstance(v, set) else v) for n, v in c.items()} for k, c in sorted(out.items())}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", default="/work/runs")
    ap.add_argument("--seeds", default="0,1,2,3")
    ap.add_argument("--by-cycle", action="store_true")
    ap.add_argument("arms", nargs="+")
    args = ap.parse_args()
    for arm in args.arms:
        if args.by_cycle:
            for k, c in by_cycle(Path(args.runs), arm, [int(s) for s in args.seeds.split(",")]).items():
                print(f"{arm} cycle {k}: hinted groups {c['groups']}, plans {c['plans']}, generic {c['generic']}, "
                      f"rescued {c['rescued']}/{c['samples']} guided samples")
            continue
        t = arm_stats(Path(args.runs), arm, [int(s) for s in args.seeds.split(",")])
        print(f"{arm}: rescued {t['rescued']}/{t['samples']} guided samples ({100 * t['rescued'] / max(1, t['samples']):.1f}%), "
              f"hinted groups {t['groups']}, rescued groups {t['rescued_groups']}, groups whose hint names the expression "
              f"{t['plan_groups']} (their rescued samples {t['plan_rescued']})")


if __name__ == "__main__":
    main()
