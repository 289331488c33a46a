"""Guided resampling against RL, two seeds, the same task order: curves, paired differences, the transfer
set, and where the guided signal goes.

    .venv/bin/python -m experiments.guided_resampling.summarize transfer   # evaluate base + every checkpoint on arithmetic-transfer
    .venv/bin/python -m experiments.guided_resampling.summarize            # the tables (summary.txt, CSVs, figure)

Homes: ``/work/runs/{guide,rl}-s{0,1}`` (``--runs`` to change), each a ``tentalis learn --method M --seed S
--cycles 8`` run (``launch.sh``).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
METHODS = ("rl", "guide", "resample")  # resample: guide's ablation, all-fail groups resampled without the hint
SEEDS = (0, 1)


def home(runs: Path, method: str, seed: int) -> Path:
    return runs / f"{method}-s{seed}"


def evaluated(lake, benchmark: str) -> list[str]:
    """base, then the run's checkpoints in order, that have results on ``benchmark``."""
    have = {r["checkpoint_id"] for r in lake.read("benchmark_results").to_pylist() if r["benchmark"] == benchmark}
    ckpts = [c["checkpoint_id"] for c in sorted(lake.read("checkpoints").to_pylist(), key=lambda r: r["created_at"])]
    return [c for c in ["base", *ckpts] if c in have]


def transfer(args) -> None:
    """Evaluate base and every checkpoint of every run on the transfer set (skips those already done)."""
    from tentalis_pipelines.lakehouse import Lakehouse

    for method in args.methods or METHODS:
        for seed in SEEDS:
            h = home(Path(args.runs), method, seed)
            lake = Lakehouse(h / "lakehouse")
            done = set(evaluated(lake, "arithmetic-transfer"))
            ckpts = [c["checkpoint_id"] for c in sorted(lake.read("checkpoints").to_pylist(), key=lambda r: r["created_at"])]
            for cid in ["base", *ckpts]:
                if cid in done or (cid == "base" and (method, seed) != (METHODS[0], SEEDS[0]) and not args.every_base):
                    continue
                env = {**os.environ, "TENTALIS_HOME": str(h), "PYTHONPATH": str(ROOT)}
                env.pop("DAGSTER_HOME", None)
                print(f"{method} seed {seed}: {cid} on arithmetic-transfer", flush=True)
                subprocess.run([sys.executable, "-m", "tentalis_pipelines.cli", "benchmark", "--checkpoint", cid,
                                "--benchmark", "arithmetic-transfer", "--format", "json"], env=env, check=True, cwd=ROOT)


def curves(runs: Path, benchmark: str) -> dict[tuple[str, int], list[dict[str, bool]]]:
    """Per (method, seed): item correctness of each evaluated checkpoint in order (index 0 = base)."""
    from tentalis_pipelines.lakehouse import Lakehouse
    from tentalis_pipelines.promotion import item_correctness

    out = {}
    base_items = None
    for method in METHODS:
        for seed in SEEDS:
            if not (home(runs, method, seed) / "lakehouse" / "checkpoints").exists():
                continue
            lake = Lakehouse(home(runs, method, seed) / "lakehouse")
            ids = evaluated(lake, benchmark)
            items = [item_correctness(lake, cid, benchmark) for cid in ids]
            if ids and ids[0] == "base":
                base_items = base_items or items[0]
            elif base_items is not None:  # the base is the same model everywhere: measured once per benchmark
                items = [base_items, *items]
            out[(method, seed)] = items
    return out


def pooled(curve: dict, method: str, cycle: int) -> tuple[int, int] | None:
    k = n = 0
    for seed in SEEDS:
        items = curve.get((method, seed), [])
        if cycle >= len(items):
            return None
        k += sum(items[cycle].values())
        n += len(items[cycle])
    return k, n


def paired(curve: dict, a: tuple[str, int], b: tuple[str, int]) -> tuple[float, float, float, int] | None:
    """(a - b) over (seed, item) pairs, a and b as (method, cycle), 95% bootstrap interval."""
    from tentalis_pipelines.statistics import paired_bootstrap

    xs, ys = [], []
    for seed in SEEDS:
        if (a[0], seed) not in curve or (b[0], seed) not in curve:
            return None
        ia, ib = curve[(a[0], seed)], curve[(b[0], seed)]
        if a[1] >= len(ia) or b[1] >= len(ib):
            return None
        for item in sorted(ia[a[1]]):
            xs.append(float(ia[a[1]][item]))
            ys.append(float(ib[b[1]][item]))
    d, lo, hi = paired_bootstrap(xs, ys)
    return d, lo, hi, len(xs)


def guided_stats(runs: Path, method: str = "guide") -> list[dict]:
    """Per guide (or resample) run and batch: all-fail groups, resampled, rescued; the checkpoint's ratio stats."""
    from tentalis_pipelines.lakehouse import Lakehouse

    rows = []
    for seed in SEEDS:
        if not (home(runs, method, seed) / "lakehouse" / "checkpoints").exists():
            continue
        lake = Lakehouse(home(runs, method, seed) / "lakehouse")
        traj = lake.read("trajectories").to_pylist()
        guided = lake.read("guided_rollouts").to_pylist()
        ckpts = sorted(lake.read("checkpoints").to_pylist(), key=lambda r: r["created_at"])
        by_batch = defaultdict(list)
        for t in traj:
            by_batch[t["batch_id"]].append(t)
        for c in ckpts:
            metrics = json.loads(c["metrics"]) if isinstance(c["metrics"], str) else (c["metrics"] or {})
            for b in c["trained_on"]:
                groups = defaultdict(list)
                for t in by_batch[b]:
                    if not t.get("guide_hint_id"):
                        groups[t["task_id"]].append(t["outcome_reward"])
                all_fail = sum(1 for v in groups.values() if max(v) == 0)
                g = [x for x in guided if x["batch_id"] == b]
                rows.append({"method": method, "seed": seed, "batch_id": b, "checkpoint_id": c["checkpoint_id"], "groups": len(groups),
                             "all_fail_groups": all_fail, "resampled_groups": len({x["task_id"] for x in g}),
                             "rescued_groups": len({x["task_id"] for x in g if x["correct"]}),
                             "guided_samples": len(g), "guided_successes": sum(x["correct"] for x in g),
                             "trained_guided": metrics.get("guided_samples"), "samples": metrics.get("samples"),
                             "guided_log_ratio": metrics.get("guided_log_ratio"), "clip_fraction": metrics.get("clip_fraction")})
    return rows


def fmt_cell(kn) -> str:
    from tentalis_pipelines.statistics import wilson_interval

    if kn is None:
        return "-"
    k, n = kn
    lo, hi = wilson_interval(k, n)
    return f"{100 * k / n:.1f}% [{100 * lo:.1f}, {100 * hi:.1f}]"


def fmt_diff(p) -> str:
    if p is None:
        return "-"
    d, lo, hi, n = p
    return f"{100 * d:+.1f} [{100 * lo:+.1f}, {100 * hi:+.1f}] (n={n})"


def summarize(args) -> None:
    runs = Path(args.runs)
    lines = []
    curve_rows = []
    for bench in ("arithmetic", "arithmetic-transfer"):
        c = curves(runs, bench)
        cycles = max(len(v) for v in c.values())
        if cycles == 0:
            continue
        lines.append(f"\n## {bench} (strict, 2 seeds pooled, Wilson 95%)\n")
        lines.append("| cycle | " + " | ".join(METHODS) + " | guide - rl (paired) | guide - resample (paired) |")
        lines.append("|---|" + "---|" * (len(METHODS) + 2))
        for k in range(cycles):
            cells = [fmt_cell(pooled(c, m, k)) for m in METHODS]
            lines.append(f"| {'base' if k == 0 else k} | " + " | ".join(cells) + f" | {fmt_diff(paired(c, ('guide', k), ('rl', k)))} "
                         f"| {fmt_diff(paired(c, ('guide', k), ('resample', k)))} |")
            for m in METHODS:
                for s in SEEDS:
                    items = c.get((m, s), [])
                    if k < len(items):
                        curve_rows.append({"benchmark": bench, "method": m, "seed": s, "cycle": k, "n": len(items[k]),
                                           "correct": sum(items[k].values())})
        last = cycles - 1
        lines.append("")
        lines.append(f"* guide cycle {last} - rl cycle {last}: {fmt_diff(paired(c, ('guide', last), ('rl', last)))}")
        lines.append(f"* guide cycle 4 - rl cycle {last}: {fmt_diff(paired(c, ('guide', 4), ('rl', last)))}")
        lines.append(f"* guide cycle {last} - resample cycle {last}: {fmt_diff(paired(c, ('guide', last), ('resample', last)))}")
        lines.append(f"* resample cycle {last} - rl cycle {last}: {fmt_diff(paired(c, ('resample', last), ('rl', last)))}")
        for m in METHODS:
            lines.append(f"* {m} cycle {last} - base: {fmt_diff(paired(c, (m, last), (m, 0)))}")
    all_stats = []
    for method in ("guide", "resample"):
        stats = guided_stats(runs, method)
        all_stats += stats
        if not stats:
            continue
        tot = {k: sum(r[k] or 0 for r in stats) for k in ("groups", "all_fail_groups", "resampled_groups", "rescued_groups",
                                                            "guided_samples", "guided_successes")}
        lines.append(f"\n## Where the guided signal goes ({method}, both seeds, all batches)\n")
        lines.append(f"* groups {tot['groups']}, all-fail {tot['all_fail_groups']} ({100 * tot['all_fail_groups'] / max(tot['groups'], 1):.0f}%), "
                     f"resampled {tot['resampled_groups']}, rescued (>= 1 correct resample) {tot['rescued_groups']} "
                     f"({100 * tot['rescued_groups'] / max(tot['all_fail_groups'], 1):.0f}% of all-fail groups)")
        lines.append(f"* resampled samples {tot['guided_samples']}, correct {tot['guided_successes']} "
                     f"({100 * tot['guided_successes'] / max(tot['guided_samples'], 1):.1f}%)")
        ratios = [r["guided_log_ratio"] for r in stats if r["guided_log_ratio"] is not None]
        if ratios:
            lines.append(f"* mean log pi(a|s) - log pi_b(a|s + hint) over guided tokens, per checkpoint: "
                         f"{min(ratios):+.3f} .. {max(ratios):+.3f} (mean {sum(ratios) / len(ratios):+.3f})")
    if all_stats:
        with (HERE / "guided_batches.csv").open("w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=list(all_stats[0]))
            w.writeheader()
            w.writerows(all_stats)
    with (HERE / "curves.csv").open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=["benchmark", "method", "seed", "cycle", "n", "correct"])
        w.writeheader()
        w.writerows(curve_rows)
    text = "\n".join(lines)
    (HERE / "summary.txt").write_text(text + "\n")
    print(text)
    _figure(curve_rows)


def _figure(rows: list[dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6), sharey=True)
    for ax, bench in zip(axes, ("arithmetic", "arithmetic-transfer")):
        for m, style in zip(METHODS, ("-o", "-s", "-^")):
            by_cycle = defaultdict(lambda: [0, 0])
            for r in rows:
                if r["benchmark"] == bench and r["method"] == m:
                    by_cycle[r["cycle"]][0] += r["correct"]
                    by_cycle[r["cycle"]][1] += r["n"]
            xs = sorted(by_cycle)
            if not xs:
                continue
            ax.plot(xs, [100 * by_cycle[x][0] / by_cycle[x][1] for x in xs], style, label=m)
        ax.set_title(bench)
        ax.set_xlabel("cycle (0 = base)")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("held-out accuracy, 2 seeds pooled (%)")
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(HERE / "guided_resampling.png", dpi=120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("cmd", nargs="?", default="summarize", choices=["summarize", "transfer"])
    ap.add_argument("--runs", default="/work/runs")
    ap.add_argument("--every-base", action="store_true", help="transfer: evaluate the base model in every home")
    ap.add_argument("--method", dest="methods", action="append", choices=METHODS, help="transfer: only these runs")
    args = ap.parse_args()
    transfer(args) if args.cmd == "transfer" else summarize(args)


if __name__ == "__main__":
    main()
