"""Round 8: the manager gate's score checks against the untrained manager, on all the held-out accepted
answers and on random subsets of them (how often a gate that saw K accepted answers passes each manager's
score). Reads the ``manager_evals`` rows eval_round8.sh wrote; the home must serve the untrained manager.

    python -m experiments.manager_rl.gate_round8 --home /work/runs/mgr8-gate-s0 m-7884511cb361 m-42a3e641f7ba
"""

from __future__ import annotations

import argparse
import csv
import random
from pathlib import Path

from tentalis_pipelines.lakehouse import Lakehouse
from tentalis_pipelines.promotion import GateNotReady
from tentalis_pipelines.stages.manager_training import decide_manager_gate
from tentalis_pipelines.training import manager_rl, serving
from tentalis_pipelines.training.manager_rl import ManagerRLConfig


def score_rules_pass(cand: list[dict], inc: dict[str, dict], tolerance: float) -> bool:
    """The gate's two score rules (balanced error, gap), point estimates, on ``cand``'s rows."""
    c = [(r["score"], r["verifier_score"], r["worker_correct"]) for r in cand]
    i = [(inc[r["rollout_id"]]["score"], r["verifier_score"], r["worker_correct"]) for r in cand]
    if manager_rl.balanced_score_error(c) > manager_rl.balanced_score_error(i) + tolerance:
        return False
    sc, si = manager_rl.score_separation(c), manager_rl.score_separation(i)
    return sc is None or si is None or sc >= si - tolerance


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--home", type=Path, required=True)
    ap.add_argument("--draws", type=int, default=2000)
    ap.add_argument("--sizes", default="10,20,40,60")
    ap.add_argument("--csv", type=Path, default=None)
    ap.add_argument("--figure", type=Path, default=None, help="the pass rates against K, as a PNG")
    ap.add_argument("candidates", nargs="+")
    args = ap.parse_args()
    lake = Lakehouse(args.home / "lakehouse")
    if serving.serving_checkpoint(lake, "manager") != serving.BASE:
        raise SystemExit("the home must serve the untrained manager: `tentalis rollback --role manager --to base`")
    evals = lake.read("manager_evals").to_pylist()
    base = {r["rollout_id"]: r for r in evals if r["checkpoint_id"] == serving.BASE}
    cfg = ManagerRLConfig()
    out = []
    for cid in args.candidates:
        rows = [r for r in evals if r["checkpoint_id"] == cid and r["rollout_id"] in base]
        acc = [r for r in rows if r["worker_correct"]]
        fail = [r for r in rows if not r["worker_correct"]]
        pairs = [(r["score"], base[r["rollout_id"]]["score"], r["worker_correct"]) for r in rows]
        diff = manager_rl.separation_difference(pairs)
        sep = manager_rl.score_separation([(r["score"], r["verifier_score"], r["worker_correct"]) for r in rows])
        sep_b = manager_rl.score_separation([(base[r["rollout_id"]]["score"], r["verifier_score"], r["worker_correct"]) for r in rows])
        err = manager_rl.balanced_score_error([(r["score"], r["verifier_score"], r["worker_correct"]) for r in rows])
        err_b = manager_rl.balanced_score_error([(base[r["rollout_id"]]["score"], r["verifier_score"], r["worker_correct"])
                                                 for r in rows])
        try:
            _, d, _, _ = decide_manager_gate(lake, cid, cfg, apply=False)
            verdict = ("promote" if d.promote else "reject") + ": " + d.reason
        except GateNotReady as exc:
            verdict = f"not ready: {exc}"
        print(f"\n{cid} vs base: {len(fail)} failures, {len(acc)} accepted answers (tasks {len({r['task_id'] for r in acc})})")
        print(f"  gap {sep:+.3f} vs {sep_b:+.3f}, difference {diff[0]:+.3f} [{diff[1]:+.3f}, {diff[2]:+.3f}]; "
              f"balanced error {err:.3f} vs {err_b:.3f}")
        print(f"  gate (min {cfg.gate_min_accepted} accepted): {verdict}")
        rng = random.Random(0)
        row = {"checkpoint_id": cid, "accepted": len(acc), "failures": len(fail), "gap": sep, "base_gap": sep_b,
               "gap_diff": diff[0], "gap_diff_lo": diff[1], "gap_diff_hi": diff[2], "error": err, "base_error": err_b,
               "passes_all": score_rules_pass(rows, base, cfg.score_tolerance)}
        for k in map(int, args.sizes.split(",")):
            # drawn with replacement: K accepted answers from the population these 60 stand for (without
            # replacement, 40 of 60 would mostly repeat the full set's verdict)
            passed = sum(score_rules_pass(fail + rng.choices(acc, k=k), base, cfg.score_tolerance) for _ in range(args.draws))
            row[f"pass_share_{k}"] = passed / args.draws
            print(f"  score rules pass on {k} accepted answers drawn with replacement (and every failure): {passed / args.draws:.1%} of {args.draws} draws")
        out.append(row)
    if args.figure:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        sizes = list(map(int, args.sizes.split(",")))
        fig, ax = plt.subplots(figsize=(5.5, 3.5))
        for r in out:
            ax.plot(sizes, [100 * r[f"pass_share_{k}"] for k in sizes], marker="o",
                    label=f"{r['checkpoint_id']} (gap {r['gap']:+.3f} vs {r['base_gap']:+.3f})")
        ax.set_xlabel("accepted answers the gate sees (drawn with replacement)")
        ax.set_ylabel("score rules pass (%)")
        ax.set_title("The gate's score rules against the untrained manager", fontsize=10)
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(args.figure, dpi=120)
    if args.csv:
        keys = sorted({k for r in out for k in r}, key=lambda k: list(out[0]).index(k) if k in out[0] else 99)
        with args.csv.open("w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=keys)
            w.writeheader()
            w.writerows(out)


if __name__ == "__main__":
    main()
