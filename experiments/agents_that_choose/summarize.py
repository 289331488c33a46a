"""Summarise the issue-72 arms: `tentalis learn --tasks terminal --levels 1 --hold-out-kind last_line`
with and without a warm start on demonstrations, hint- and prefix-guided resampling (one Tentalis home
per arm and seed).

Per home: the held-out curves (``terminal-l1``: the 30 held-out level-1 tasks, five of each kind;
``terminal-l1-last_line``: 30 tasks of the kind no run trained on), per training batch what the GRPO
groups looked like (episodes passed, all-fail and mixed groups, the format rate: turns with a
well-formed action), and the guided resampling's rescue (all-fail groups resampled, groups rescued,
guided episodes that passed). Across seeds: each arm's last checkpoint evaluated within ``--minutes``
against the RL-alone arm's (the control, run side by side; its base when it never trained), paired
over (seed, task) with a bootstrap 95% interval, on every benchmark the checkpoints were evaluated on.

    PYTHONPATH=. .venv/bin/python -m experiments.agents_that_choose.summarize \
        --arm rl:0=/work/runs/rl_s0 --arm rl:1=/work/runs/rl_s1 --arm ws_both:0=/work/runs/ws_both_s0 ... \
        --control rl --minutes 90
"""

from __future__ import annotations

import argparse
import csv
import json
from collections import Counter, defaultdict
from pathlib import Path

from tentalis_pipelines.lakehouse import Lakehouse
from tentalis_pipelines.promotion import item_correctness
from tentalis_pipelines.statistics import paired_bootstrap, wilson_interval

HERE = Path(__file__).parent
BENCHMARKS = ("terminal-l1", "terminal-l1-last_line", "terminal-l1-paraphrased", "terminal-l2")


def start_time(lake: Lakehouse):
    return min(t["created_at"] for t in lake.read("tasks", columns=["created_at"]).to_pylist())


def curve(lake: Lakehouse, benchmark: str) -> list[dict]:
    """Each evaluated checkpoint in order (the base first): minutes since the first task landed, success."""
    if not lake.exists("benchmark_results"):
        return []
    start = start_time(lake)
    ckpts = sorted(lake.read("checkpoints").to_pylist(), key=lambda r: r["created_at"]) if lake.exists("checkpoints") else []
    algo = {c["checkpoint_id"]: c.get("algorithm", "") for c in ckpts}
    results = {r["checkpoint_id"]: r for r in lake.read("benchmark_results").to_pylist() if r["benchmark"] == benchmark}
    out = []
    for cid in ["base"] + [c["checkpoint_id"] for c in ckpts]:
        r = results.get(cid)
        if r is None:
            continue
        items = item_correctness(lake, cid, benchmark)
        created = next((c["created_at"] for c in ckpts if c["checkpoint_id"] == cid), None)
        out.append({"checkpoint_id": cid, "algorithm": algo.get(cid, "base"),
                    "minutes": 0.0 if cid == "base" else round((created - start).total_seconds() / 60, 1),
                    "passed": sum(items.values()), "n": len(items), "accuracy": round(r["accuracy"], 4),
                    "ci_low": round(r["ci_low"], 4), "ci_high": round(r["ci_high"], 4), "format_rate": round(r["format_rate"], 4)})
    return out


def batch_stats(lake: Lakehouse) -> list[dict]:
    """Per training batch in order: groups, all-fail, mixed, passed episodes, the format rate, and the
    guided resampling (all-fail groups resampled, rescued, guided episodes passed)."""
    rollouts = lake.read("rollouts", columns=["batch_id", "task_id", "episode", "created_at"]).to_pylist()
    guided = lake.read("guided_rollouts", columns=["batch_id", "task_id", "correct", "rescue", "prefix_turns"]).to_pylist() \
        if lake.exists("guided_rollouts") else []
    by_batch: dict[str, list[dict]] = defaultdict(list)
    for r in rollouts:
        if r["episode"]:
            by_batch[r["batch_id"]].append({**json.loads(r["episode"]), "task_id": r["task_id"], "created_at": r["created_at"]})
    out = []
    for batch_id, eps in sorted(by_batch.items(), key=lambda kv: min(e["created_at"] for e in kv[1])):
        groups: dict[str, list[bool]] = defaultdict(list)
        for e in eps:
            groups[e["task_id"]].append(bool(e["passed"]))
        g_rows = [g for g in guided if g["batch_id"] == batch_id]
        turns = sum(e["turns"] for e in eps)
        out.append({
            "batch_id": batch_id, "episodes": len(eps), "passed": sum(e["passed"] for e in eps), "groups": len(groups),
            "all_fail_groups": sum(1 for g in groups.values() if not any(g)),
            "mixed_groups": sum(1 for g in groups.values() if 0 < sum(g) < len(g)),
            "all_pass_groups": sum(1 for g in groups.values() if all(g)),
            "format_rate": round(1 - sum(e["format_errors"] for e in eps) / turns, 4) if turns else "",
            "mean_turns": round(turns / len(eps), 2),
            "resampled_groups": len({g["task_id"] for g in g_rows}),
            "rescued_groups": len({g["task_id"] for g in g_rows if g["correct"]}),
            "guided_episodes": len(g_rows), "guided_passed": sum(bool(g["correct"]) for g in g_rows),
            "rescues": json.dumps(dict(Counter(g["rescue"] for g in g_rows)), sort_keys=True),
            "ends": json.dumps(dict(Counter(e["end_reason"].split(":")[0] for e in eps)), sort_keys=True),
        })
    return out


def last_within(rows: list[dict], minutes: float) -> dict | None:
    within = [r for r in rows if r["minutes"] <= minutes]
    return within[-1] if within else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arm", action="append", required=True, help="ARM:SEED=PATH of a run's Tentalis home (repeat)")
    ap.add_argument("--control", default="rl", help="the arm every other is compared with (paired per seed and task)")
    ap.add_argument("--minutes", type=float, default=90.0, help="each arm's last checkpoint evaluated within this many minutes")
    ap.add_argument("--out", type=Path, default=HERE)
    args = ap.parse_args()
    homes: dict[tuple[str, str], Lakehouse] = {}
    for spec in args.arm:
        key, path = spec.split("=", 1)
        arm, seed = key.split(":")
        homes[(arm, seed)] = Lakehouse(Path(path) / "lakehouse")
    curve_rows: list[dict] = []
    batch_rows: list[dict] = []
    final: dict[tuple[str, str, str], dict | None] = {}
    base_items: dict[str, dict[str, bool]] = {}
    for (arm, seed), lake in homes.items():
        for bench in BENCHMARKS:
            rows = curve(lake, bench)
            curve_rows += [{"arm": arm, "seed": seed, "benchmark": bench, **r} for r in rows]
            if rows and rows[0]["checkpoint_id"] == "base":
                base_items.setdefault(bench, item_correctness(lake, "base", bench))
            last = last_within([r for r in rows if r["checkpoint_id"] != "base"], args.minutes)
            final[(arm, seed, bench)] = last
        for k, b in enumerate(batch_stats(lake), 1):
            batch_rows.append({"arm": arm, "seed": seed, "batch": k, **b})
    for name, rows in (("curve", curve_rows), ("batches", batch_rows)):
        if rows:
            with (args.out / f"agents_that_choose_{name}.csv").open("w", newline="") as fh:
                w = csv.DictWriter(fh, fieldnames=list(rows[0]))
                w.writeheader()
                w.writerows(rows)

    def trained(arm: str, seed: str) -> bool:
        lake = homes[(arm, seed)]
        return lake.exists("checkpoints") and lake.read("checkpoints", columns=["checkpoint_id"]).num_rows > 0

    def items_of(arm: str, seed: str, bench: str) -> dict[str, bool] | None:
        if arm.endswith("@warm_start"):  # the arm's warm-start checkpoint alone (before any RL cycle)
            lake = homes[(arm.split("@")[0], seed)]
            warm = [c for c in lake.read("checkpoints").to_pylist() if c.get("algorithm") == "sft_warm_start"]
            return item_correctness(lake, warm[0]["checkpoint_id"], bench) or None if warm else None
        last = final.get((arm, seed, bench))
        if last is not None:
            return item_correctness(homes[(arm, seed)], last["checkpoint_id"], bench)
        if not trained(arm, seed):  # never trained: its policy is the base, so is its outcome
            return base_items.get(bench)
        return None  # trained, but not evaluated on this benchmark: left out, never counted as the base

    arms = sorted({a for a, _ in homes})
    arms += [f"{a}@warm_start" for a in arms if any(c.get("algorithm") == "sft_warm_start"
                                                     for (a2, s_), lake in homes.items() if a2 == a and lake.exists("checkpoints")
                                                     for c in lake.read("checkpoints", columns=["algorithm"]).to_pylist())]
    seeds = sorted({s for _, s in homes})
    print(f"each arm's last checkpoint within {args.minutes:.0f} min vs the {args.control!r} arm's, paired over (seed, task):")
    for bench in BENCHMARKS:
        if bench not in base_items:
            continue
        base = base_items[bench]
        print(f"\n{bench}: base {sum(base.values())}/{len(base)}")
        for arm in arms:
            pairs = []
            for seed in seeds:
                if (arm.split("@")[0], seed) not in homes:
                    continue
                mine, ctrl = items_of(arm, seed, bench), items_of(args.control, seed, bench) if (args.control, seed) in homes else base
                if not mine or not ctrl:
                    continue
                pairs += [(float(mine[i]), float(ctrl[i])) for i in sorted(set(mine) & set(ctrl))]
            if not pairs:
                continue
            after, before = sum(p[0] for p in pairs), sum(p[1] for p in pairs)
            lo_w, hi_w = wilson_interval(int(after), len(pairs))
            line = f"  {arm:>14}: {after:.0f}/{len(pairs)} ({after / len(pairs):.1%}, Wilson [{lo_w:.3f}, {hi_w:.3f}])"
            if arm != args.control:
                d, lo, hi = paired_bootstrap([p[0] for p in pairs], [p[1] for p in pairs], seed=0)
                line += f" vs {args.control} {before:.0f}/{len(pairs)}: {d * 100:+.1f} points [{lo * 100:+.1f}, {hi * 100:+.1f}]"
            print(line)
    print("\nper arm over its training batches: all-fail groups resampled / rescued, format rate")
    for arm in [a for a in arms if "@" not in a]:
        rows = [b for b in batch_rows if b["arm"] == arm]
        if rows:
            af = sum(b["all_fail_groups"] for b in rows)
            print(f"  {arm:>14}: {len(rows)} batches, {sum(b['groups'] for b in rows)} groups, {af} all-fail, "
                  f"{sum(b['mixed_groups'] for b in rows)} mixed; resampled {sum(b['resampled_groups'] for b in rows)}, "
                  f"rescued {sum(b['rescued_groups'] for b in rows)} ({sum(b['rescued_groups'] for b in rows) / af:.1%} of all-fail)"
                  if af else f"  {arm:>14}: {len(rows)} batches, no all-fail group")
            fr = [b["format_rate"] for b in rows if b["format_rate"] != ""]
            print(f"  {'':>14}  format rate first {fr[0]:.3f}, last {fr[-1]:.3f}" if fr else "")
    plot(curve_rows, args.out / "agents_that_choose.png")


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    benches = [b for b in ("terminal-l1", "terminal-l1-last_line") if any(r["benchmark"] == b for r in rows)]
    if not benches:
        return
    fig, axes = plt.subplots(1, len(benches), figsize=(6 * len(benches), 4), squeeze=False)
    for ax, bench in zip(axes[0], benches):
        for arm, seed in sorted({(r["arm"], r["seed"]) for r in rows if r["benchmark"] == bench}):
            rs = [r for r in rows if r["benchmark"] == bench and r["arm"] == arm and r["seed"] == seed]
            ax.plot([r["minutes"] for r in rs], [r["accuracy"] for r in rs], marker="o", label=f"{arm} s{seed}")
        ax.set_xlabel("minutes since the run's first task")
        ax.set_ylabel(f"held-out success, {bench} (greedy, 30 tasks)")
        ax.set_ylim(0, 1)
        ax.legend(fontsize=7)
        ax.set_title(bench)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
