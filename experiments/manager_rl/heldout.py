"""Managers on the same held-out rollouts, paired: what ``tentalis manager evaluate`` measured for each checkpoint
(``manager_evals``) against a reference checkpoint, with the gate's own measures.

Per checkpoint: held-out failures and accepted answers, usable hints, rescued worker samples, rescue per failure
(an unusable hint rescues 0, the gate's ``rescue_by_failure``), class-balanced score error and score gap
(``manager_rl``), unparseable scores. Against the reference, on the rollouts both reviewed: the rescue per failure
(paired bootstrap over failures) and the score gap (``manager_rl.separation_difference``: paired, within class).
Every checkpoint must have been measured with the same worker (the gate's rule).

Usage: python -m experiments.manager_rl.heldout --home /work/runs/mgr15-exp base m-d6ed014e733e m-725aca102271 ...
"""

from __future__ import annotations

import argparse
from pathlib import Path

from tentalis_pipelines.lakehouse import Lakehouse
from tentalis_pipelines.stages.manager_training import rescue_by_failure
from tentalis_pipelines.statistics import paired_bootstrap
from tentalis_pipelines.training import manager_rl


def summary(rows: list[dict]) -> dict:
    fails = [r for r in rows if not r["worker_correct"]]
    triples = [(r["score"], r["verifier_score"], r["worker_correct"]) for r in rows]
    return {"failures": len(fails), "accepted": len(rows) - len(fails), "usable": sum(r["hint_decision"] == "used" for r in fails),
            "rescued": sum(r["rescued"] or 0 for r in fails), "samples": sum(r["rescue_k"] or 0 for r in fails),
            "rescue": sum(rescue_by_failure(rows).values()) / max(len(fails), 1),
            "error": manager_rl.balanced_score_error(triples), "gap": manager_rl.score_separation(triples),
            "unparseable": sum(r["score"] is None for r in rows)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--home", type=Path, required=True)
    ap.add_argument("reference")
    ap.add_argument("checkpoints", nargs="+")
    args = ap.parse_args()
    evals = Lakehouse(args.home / "lakehouse").read("manager_evals").to_pylist()
    by = {c: {r["rollout_id"]: r for r in evals if r["checkpoint_id"] == c} for c in [args.reference, *args.checkpoints]}
    workers = {r["worker_version"] for rows in by.values() for r in rows.values()}
    if len(workers) != 1:
        raise SystemExit(f"the checkpoints were measured with different workers {sorted(workers)}: evaluate them again under one")
    common = set.intersection(*(set(rows) for rows in by.values()))
    if not common:
        raise SystemExit(f"no held-out rollout was reviewed by all of {list(by)}: run `tentalis manager evaluate` for each")
    print(f"{len(common)} held-out rollouts reviewed by all {len(by)} managers (worker {workers.pop()})")
    print("| manager | failures / accepted | usable hints | rescued / samples | rescue per failure | class-balanced error | "
          "score gap | unparseable | rescue − reference (paired) | gap − reference (paired) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    ref = [by[args.reference][k] for k in sorted(common)]
    ref_rescue = rescue_by_failure(ref)
    for c, rows_by in by.items():
        rows = [rows_by[k] for k in sorted(common)]
        s = summary(rows)
        line = (f"| {c} | {s['failures']} / {s['accepted']} | {s['usable']} | {s['rescued']} / {s['samples']} | {s['rescue']:.3f} | "
                f"{s['error']:.3f} | {'n/a' if s['gap'] is None else format(s['gap'], '+.3f')} | {s['unparseable']} |")
        if c == args.reference:
            print(line + " | |")
            continue
        mine = rescue_by_failure(rows)
        keys = sorted(mine)
        d, lo, hi = paired_bootstrap([mine[k] for k in keys], [ref_rescue[k] for k in keys])
        sep = manager_rl.separation_difference([(r["score"], by[args.reference][r["rollout_id"]]["score"], r["worker_correct"])
                                                for r in rows])
        gap = f"{sep[0]:+.3f} [{sep[1]:+.3f}, {sep[2]:+.3f}]" if sep else "n/a"
        print(line + f" {d:+.3f} [{lo:+.3f}, {hi:+.3f}] | {gap} |")


if __name__ == "__main__":
    main()
