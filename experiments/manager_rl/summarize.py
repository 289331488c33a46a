"""The manager that learns: the manager's own gate figures, and the worker's guided learning with the
untrained against the trained manager's hints (two seeds, the same task order).

    .venv/bin/python -m experiments.manager_rl.summarize        # summary.txt, manager.csv, curves.csv

Homes (``run.sh``): ``$RUNS/mgr-exp`` (failures, the manager's training and gate) and
``$RUNS/mgr-{base,trained}-s{0,1}`` (``tentalis learn --method guide --manager llm``).
"""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path

from experiments.guided_resampling.summarize import SEEDS, fmt_cell, fmt_diff, paired, pooled

HERE = Path(__file__).resolve().parent
ARMS = ("base", "trained")


def manager_rows(runs: Path) -> tuple[list[dict], list[str]]:
    """Per manager evaluated on the held-out rollouts: usable hints, rescue, score error; and the paired
    rescue difference of the last trained manager against the untrained one."""
    from tentalis_pipelines.lakehouse import Lakehouse
    from tentalis_pipelines.statistics import paired_bootstrap
    from tentalis_pipelines.training.manager_rl import balanced_score_error, score_error

    lake = Lakehouse(runs / "mgr-exp" / "lakehouse")
    evals = lake.read("manager_evals").to_pylist()
    ckpts = sorted(lake.read("manager_checkpoints").to_pylist(), key=lambda r: r["created_at"])
    rows, lines = [], []
    by = {}
    for cid in ["base", *[c["checkpoint_id"] for c in ckpts]]:
        rs = [r for r in evals if r["checkpoint_id"] == cid]
        if not rs:
            continue
        by[cid] = rs
        fail = [r for r in rs if not r["worker_correct"]]
        ok = [r for r in rs if r["worker_correct"]]
        rows.append({"manager": cid, "failures": len(fail), "accepted": len(ok),
                     "usable_hints": sum(r["hint_decision"] == "used" for r in fail),
                     "rescued": sum(r["rescued"] for r in fail), "rescue_samples": sum(r["rescue_k"] for r in fail),
                     "rescue_per_failure": sum(r["rescued"] / r["rescue_k"] if r["rescue_k"] else 0 for r in fail) / max(1, len(fail)),
                     "score_error_all": sum(score_error(r["score"], r["verifier_score"]) for r in rs) / len(rs),
                     "score_error_balanced": balanced_score_error([(r["score"], r["verifier_score"], r["worker_correct"]) for r in rs]),
                     "distinct_scores": len({r["score"] for r in rs}),
                     "score_error_failures": sum(score_error(r["score"], r["verifier_score"]) for r in fail) / max(1, len(fail)),
                     "score_error_accepted": (sum(score_error(r["score"], r["verifier_score"]) for r in ok) / len(ok)) if ok else None,
                     "unparseable": sum(r["score"] is None for r in rs)})
    lines.append("\n## The manager on held-out rollouts (greedy review; rescue: 8 worker samples per hint)\n")
    lines.append("| manager | failures / accepted | usable hints | rescued / samples | rescue per failure | score error (all / failures / "
                 "accepted / class-balanced) | distinct scores | unparseable |")
    lines.append("|---|---|---|---|---|---|---|---|")
    for r in rows:
        acc = "-" if r["score_error_accepted"] is None else f"{r['score_error_accepted']:.3f}"
        lines.append(f"| {r['manager']} | {r['failures']} / {r['accepted']} | {r['usable_hints']} | {r['rescued']} / {r['rescue_samples']} | "
                     f"{r['rescue_per_failure']:.3f} | {r['score_error_all']:.3f} / {r['score_error_failures']:.3f} / {acc} / "
                     f"{r['score_error_balanced']:.3f} | {r['distinct_scores']} | {r['unparseable']} |")
    trained = [c for c in by if c != "base"]
    if "base" in by and trained:
        last = trained[-1]
        b = {r["rollout_id"]: r for r in by["base"] if not r["worker_correct"]}
        t = {r["rollout_id"]: r for r in by[last] if not r["worker_correct"]}
        keys = sorted(b.keys() & t.keys())
        val = lambda r: r["rescued"] / r["rescue_k"] if r["rescue_k"] else 0.0  # noqa: E731
        d, lo, hi = paired_bootstrap([val(t[k]) for k in keys], [val(b[k]) for k in keys])
        lines.append(f"\n* rescue per held-out failure, {last} - base: {d:+.3f} [{lo:+.3f}, {hi:+.3f}] (n={len(keys)}, paired bootstrap)")
        for cid in ("base", last):
            rs = [r for r in by[cid] if r["score"] is not None]
            if len({r["score"] for r in rs}) < 2:
                lines.append(f"* {cid}: one score for every rollout ({rs[0]['score'] if rs else None}): no ranking, Spearman undefined")
            elif len(rs) >= 3:
                rho, rlo, rhi = spearman_interval([r["score"] for r in rs], [r["verifier_score"] for r in rs])
                lines.append(f"* {cid}: Spearman of its score with the verifier's {rho:+.3f} [{rlo:+.3f}, {rhi:+.3f}] (n={len(rs)})")
    lines.append("\n## The manager's training updates\n")
    lines.append("| checkpoint | parent | failures | accepted | reward | usable hints | rescue | score error | unparseable |")
    lines.append("|---|---|---|---|---|---|---|---|---|")
    for c in ckpts:
        m = json.loads(c["metrics"])
        lines.append(f"| {c['checkpoint_id']} | {c['parent_id'] or 'base'} | {m.get('failures')} | {m.get('accepted')} | "
                     f"{m['reward_mean']:+.3f} | {m['usable_hint_share']:.0%} | {m.get('rescue_rate')} | {m['score_error']:.3f} | "
                     f"{m.get('unparseable')} |")
    return rows, lines


def spearman_interval(x: list[float], y: list[float], n_boot: int = 2000, seed: int = 0) -> tuple[float | None, float, float]:
    """Spearman's rho (the product's, rewards/agreement.py) with a 95% bootstrap interval over pairs."""
    import numpy as np

    from tentalis_pipelines.rewards.agreement import spearman

    rng = np.random.default_rng(seed)
    boots = []
    for _ in range(n_boot):
        idx = rng.integers(0, len(x), len(x))
        r = spearman([x[i] for i in idx], [y[i] for i in idx])
        if r is not None:
            boots.append(r)
    lo, hi = (float(np.percentile(boots, 2.5)), float(np.percentile(boots, 97.5))) if boots else (float("nan"), float("nan"))
    return spearman(x, y), lo, hi


def worker_curves(runs: Path, benchmark: str = "arithmetic") -> dict:
    from tentalis_pipelines.lakehouse import Lakehouse
    from tentalis_pipelines.promotion import item_correctness

    out, base_items = {}, None
    for arm in ARMS:
        for seed in SEEDS:
            h = runs / f"mgr-{arm}-s{seed}" / "lakehouse"
            if not (h / "checkpoints").exists():
                continue
            lake = Lakehouse(h)
            have = {r["checkpoint_id"] for r in lake.read("benchmark_results").to_pylist() if r["benchmark"] == benchmark}
            ckpts = [c["checkpoint_id"] for c in sorted(lake.read("checkpoints").to_pylist(), key=lambda r: r["created_at"])]
            items = [item_correctness(lake, c, benchmark) for c in ["base", *ckpts] if c in have]
            if "base" in have:
                base_items = base_items or items[0]
            else:  # the base is the same model in every home: the transfer set measured it once (mgr-base-s0)
                items = [None, *items]
            out[(arm, seed)] = items
    for v in out.values():
        if v and v[0] is None:
            v[0] = base_items
    return {k: v for k, v in out.items() if all(x is not None for x in v)}


def figure(c: dict, cycles: int) -> None:
    """Held-out accuracy per cycle, pooled over seeds, with Wilson intervals: manager_rl.png."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from tentalis_pipelines.statistics import wilson_interval

    fig, ax = plt.subplots(figsize=(6, 3.6))
    for arm, label in (("base", "untrained manager"), ("trained", "trained manager")):
        xs, ys, lo, hi = [], [], [], []
        for k in range(cycles):
            kn = pooled(c, arm, k)
            if kn is None:
                continue
            a, b = wilson_interval(*kn)
            xs.append(k)
            ys.append(100 * kn[0] / kn[1])
            lo.append(100 * a)
            hi.append(100 * b)
        ax.plot(xs, ys, marker="o", label=label)
        ax.fill_between(xs, lo, hi, alpha=0.15)
    ax.set_xlabel("cycle (0 = base model)")
    ax.set_ylabel("held-out arithmetic accuracy (%)")
    ax.set_title("--method guide --manager llm, 2 seeds pooled")
    ax.legend()
    fig.tight_layout()
    fig.savefig(HERE / "manager_rl.png", dpi=120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", default="/work/runs")
    args = ap.parse_args()
    runs = Path(args.runs)
    rows, lines = manager_rows(runs)
    with open(HERE / "manager.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    c = worker_curves(runs)
    if c:
        cycles = max(len(v) for v in c.values())
        lines.append("\n## The worker: guided learning with each manager's hints (arithmetic held-out, 2 seeds pooled)\n")
        lines.append("| cycle | untrained manager | trained manager | trained - untrained (paired) |")
        lines.append("|---|---|---|---|")
        curve_rows = []
        for k in range(cycles):
            lines.append(f"| {'base' if k == 0 else k} | {fmt_cell(pooled(c, 'base', k))} | {fmt_cell(pooled(c, 'trained', k))} | "
                         f"{fmt_diff(paired(c, ('trained', k), ('base', k)))} |")
            for (arm, seed), items in sorted(c.items()):
                if k < len(items):
                    curve_rows.append({"arm": arm, "seed": seed, "cycle": k, "n": len(items[k]), "correct": sum(items[k].values())})
        with open(HERE / "curves.csv", "w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=["arm", "seed", "cycle", "n", "correct"])
            w.writeheader()
            w.writerows(curve_rows)
        figure(c, cycles)
    t = worker_curves(runs, "arithmetic-transfer")
    if t:
        lines.append("\n## The same workers on the transfer set (`arithmetic-transfer`: other templates, larger numbers, two-step; "
                     "2 seeds pooled)\n")
        lines.append("| cycle | untrained manager | trained manager | trained - untrained (paired) |")
        lines.append("|---|---|---|---|")
        rows_t = []
        for k in range(max(len(v) for v in t.values())):
            lines.append(f"| {'base' if k == 0 else k} | {fmt_cell(pooled(t, 'base', k))} | {fmt_cell(pooled(t, 'trained', k))} | "
                         f"{fmt_diff(paired(t, ('trained', k), ('base', k)))} |")
            for (arm, seed), items in sorted(t.items()):
                if k < len(items):
                    rows_t.append({"arm": arm, "seed": seed, "cycle": k, "n": len(items[k]), "correct": sum(items[k].values())})
        with open(HERE / "curves_transfer.csv", "w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=["arm", "seed", "cycle", "n", "correct"])
            w.writeheader()
            w.writerows(rows_t)
    text = "\n".join(lines) + "\n"
    (HERE / "summary.txt").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
