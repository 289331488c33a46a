"""Summarise `tentalis learn --tasks terminal --levels 0` runs (one Tentalis home per seed).

For every home: the held-out curve on ``terminal-l0`` (each checkpoint's success, its Wilson interval,
the minutes since the run's first task landed), and per cycle what the GRPO groups looked like (episodes
passed, mixed groups, mean turns, format errors, end reasons). Across seeds: the paired difference of
held-out success between the base model and each seed's last checkpoint evaluated within ``--minutes``,
over (seed, task) pairs, with a paired bootstrap 95% interval (``statistics.paired_bootstrap``).

    PYTHONPATH=. .venv/bin/python -m experiments.terminal_learning.summarize \
        --home 0=/path/to/home-seed0 --home 1=/path/to/home-seed1 --minutes 60
"""

from __future__ import annotations

import argparse
import csv
import json
from collections import Counter, defaultdict
from pathlib import Path

from tentalis_pipelines.evaluation.learning_runs import rows_for
from tentalis_pipelines.lakehouse import Lakehouse
from tentalis_pipelines.promotion import item_correctness
from tentalis_pipelines.statistics import paired_bootstrap, wilson_interval

HERE = Path(__file__).parent
BENCHMARK = "terminal-l0"


def cycle_stats(lake: Lakehouse) -> list[dict]:
    """Per training batch (in order): episodes, passed, mixed groups, mean turns, format-error turns,
    end reasons, and the checkpoint trained on it."""
    rollouts = lake.read("rollouts", columns=["batch_id", "task_id", "episode", "created_at"]).to_pylist()
    by_batch: dict[str, list[dict]] = defaultdict(list)
    for r in rollouts:
        if r["episode"]:
            by_batch[r["batch_id"]].append({**json.loads(r["episode"]), "task_id": r["task_id"], "created_at": r["created_at"]})
    out = []
    for batch_id, eps in sorted(by_batch.items(), key=lambda kv: min(e["created_at"] for e in kv[1])):
        groups: dict[str, list[bool]] = defaultdict(list)
        for e in eps:
            groups[e["task_id"]].append(bool(e["passed"]))
        mixed = sum(1 for g in groups.values() if 0 < sum(g) < len(g))
        out.append({
            "batch_id": batch_id, "episodes": len(eps), "passed": sum(e["passed"] for e in eps),
            "tasks": len(groups), "mixed_groups": mixed, "all_pass_groups": sum(1 for g in groups.values() if all(g)),
            "mean_turns": round(sum(e["turns"] for e in eps) / len(eps), 2),
            "format_error_turns": sum(e["format_errors"] for e in eps),
            "ends": dict(Counter(e["end_reason"].split(":")[0] for e in eps)),
        })
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--home", action="append", required=True, help="SEED=PATH of a run's Tentalis home (repeat per seed)")
    ap.add_argument("--minutes", type=float, default=60.0, help="the paired comparison uses the last checkpoint evaluated by then")
    ap.add_argument("--label", default="terminal-l0 default recipe")
    ap.add_argument("--out", type=Path, default=HERE)
    args = ap.parse_args()
    curve_rows, cycle_rows, pairs = [], [], []
    for spec in args.home:
        seed, path = spec.split("=", 1)
        home = Path(path)
        lake = Lakehouse(home / "lakehouse")
        curve = rows_for(home, int(seed), args.label, benchmark=BENCHMARK)
        curve_rows += curve
        for k, c in enumerate(cycle_stats(lake), 1):
            cycle_rows.append({"seed": seed, "cycle": k, **c, "ends": json.dumps(c["ends"], sort_keys=True)})
        seen = {t["prompt"] for t in lake.read("tasks", columns=["prompt"]).to_pylist()}
        held = {it: p for it, p in ((r["item_id"], r["prompt"]) for r in lake.read("benchmark_items", columns=["item_id", "prompt", "benchmark"]).to_pylist()
                                    if r["benchmark"] == BENCHMARK)}
        print(f"seed {seed}: {sum(p in seen for p in held.values())} of {len(held)} held-out instructions also appear (with other files) "
              f"in the {len(seen)} distinct training instructions")
        within = [r for r in curve if r["checkpoint_id"] != "base" and r["minutes"] <= args.minutes]
        last = within[-1] if within else None
        base = item_correctness(lake, "base", BENCHMARK)
        if last is not None:
            final = item_correctness(lake, last["checkpoint_id"], BENCHMARK)
            pairs += [(seed, item, float(final[item]), float(base[item]), held.get(item) in seen) for item in sorted(set(base) & set(final))]
            print(f"seed {seed}: base {sum(base.values())}/{len(base)}, {last['checkpoint_id']} (cycle {last['cycle']}, "
                  f"{last['minutes']} min) {sum(final.values())}/{len(final)}")
    with (args.out / "terminal_learning_curve.csv").open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(curve_rows[0]))
        w.writeheader()
        w.writerows(curve_rows)
    with (args.out / "terminal_learning_cycles.csv").open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(cycle_rows[0]))
        w.writeheader()
        w.writerows(cycle_rows)
    for label, keep in (("instruction seen in training (other files)", True), ("instruction never seen in training", False)):
        part = [p for p in pairs if p[4] == keep]
        if part:
            d, lo_, hi_ = paired_bootstrap([p[2] for p in part], [p[3] for p in part], seed=0)
            print(f"  {label}: {len(part)} pairs, base {sum(p[3] for p in part):.0f} -> {sum(p[2] for p in part):.0f}; "
                  f"difference {d:+.3f} [{lo_:+.3f}, {hi_:+.3f}]")
    if pairs:
        diff, lo, hi = paired_bootstrap([p[2] for p in pairs], [p[3] for p in pairs], seed=0)
        after, before = sum(p[2] for p in pairs), sum(p[3] for p in pairs)
        print(f"paired over {len(pairs)} (seed, task) pairs: base {before:.0f}/{len(pairs)} -> {after:.0f}/{len(pairs)}; "
              f"difference {diff:+.3f}, 95% CI [{lo:+.3f}, {hi:+.3f}]; "
              f"base Wilson {wilson_interval(int(before), len(pairs))}, after Wilson {wilson_interval(int(after), len(pairs))}")
    plot(curve_rows, args.out / "terminal_learning.png")


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for seed in sorted({r["seed"] for r in rows}):
        rs = [r for r in rows if r["seed"] == seed]
        xs = [0.0 if r["checkpoint_id"] == "base" else r["minutes"] for r in rs]  # the base is the start (measured after cycle 1)
        ax.errorbar(xs, [r["accuracy"] for r in rs], yerr=[[r["accuracy"] - r["ci_low"] for r in rs], [r["ci_high"] - r["accuracy"] for r in rs]],
                    marker="o", capsize=3, label=f"seed {seed}")
    ax.set_xlabel("minutes since the run's first batch")
    ax.set_ylabel("held-out success, level 0 (greedy, 30 tasks)")
    ax.set_ylim(0, 1)
    ax.axvline(60, color="grey", ls=":", lw=1)
    ax.legend(loc="lower right")
    ax.set_title("tentalis learn --tasks terminal --levels 0 (SmolLM2-135M, default recipe)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
