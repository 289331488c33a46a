"""Round 2's worker runs: held-out arithmetic per cycle of `tentalis learn --method guide --manager llm` with the
untrained manager (evidence prompt) against the manager trained for the dense reward, paired per item.

Homes: ``$RUNS/mgr2-base-s{seed}`` and ``$RUNS/mgr2-trained-s{seed}`` (``run.sh worker`` with PREFIX=mgr2, on
branch ``manager-evidence``). Prints one row per cycle: accuracies and the paired bootstrap 95% interval of
trained - untrained over (seed, item).

Round 3 (``--prefix mgr --against noscore``): the same table for the trained arm against another arm (the
control whose reward leaves the manager's score out), and ``--per-seed`` adds each seed's last-cycle difference.

Round 4 (``--runs-level``): with several seeds an arm, the last cycle's difference also by a two-level bootstrap
(the seeds drawn with replacement, then each drawn seed's items): the item bootstrap alone treats two runs of
one configuration as identical, which round 3 showed they are not. ``--trained-prefix`` reads the compared arm
from other homes (round 4's trained arm is ``mgr4-trained-sS`` beside round 3's ``mgr-base-sS``).

Round 11 (``--csv F``): also each arm's held-out counts per seed and cycle, one row each (arm, seed, cycle, n, correct),
and beside it (``F`` with ``.png``) each seed's two curves.

Round 18 (``--items F``): also every arm's held-out answers item by item (arm, seed, cycle, item, correct), so a
later session can pair against a committed arm whose home is gone (``--from-items F``: an arm and seed found there is
read from it instead of its home).

Usage: python -m experiments.manager_rl.round2_workers [--runs /work/runs] [--seeds 0] [--prefix mgr2] [--arm trained]
       [--against base] [--per-seed] [--runs-level] [--trained-prefix P] [--csv F] [--items F] [--from-items F]
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

import numpy as np

from tentalis_pipelines.lakehouse import Lakehouse
from tentalis_pipelines.promotion import item_correctness
from tentalis_pipelines.statistics import paired_bootstrap


def curve(home: Path) -> list[dict[str, bool]]:
    lake = Lakehouse(home / "lakehouse")
    ckpts = [c["checkpoint_id"] for c in sorted(lake.read("checkpoints").to_pylist(), key=lambda r: r["created_at"])]
    return [item_correctness(lake, c, "arithmetic") for c in ["base", *ckpts]]


def read_items(path: Path) -> dict[tuple[str, int], list[dict[str, bool]]]:
    """Curves written by ``--items``: (arm, seed) -> per cycle, item -> correct."""
    out: dict[tuple[str, int], list[dict[str, bool]]] = {}
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            per_cycle = out.setdefault((r["arm"], int(r["seed"])), [])
            k = int(r["cycle"])
            per_cycle.extend({} for _ in range(k + 1 - len(per_cycle)))
            per_cycle[k][r["item"]] = r["correct"] == "1"
    return out


def write_items(path: Path, curves: dict[tuple[str, int], list[dict[str, bool]]]) -> None:
    """Every (arm, seed, cycle, item, correct) of ``curves``, keyed by arm name."""
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["arm", "seed", "cycle", "item", "correct"])
        for (arm, s), per_cycle in sorted(curves.items()):
            for k, items in enumerate(per_cycle):
                for item in sorted(items):
                    w.writerow([arm, s, k, item, int(bool(items[item]))])


def two_level_bootstrap(pairs: dict[int, tuple[list[float], list[float]]], *, n_boot: int = 4000,
                        seed: int = 0) -> tuple[float, float, float]:
    """Mean of b - a over every (seed, item) and its 95% interval when both the runs and the items are drawn:
    each replicate draws the seeds with replacement, then each drawn seed's paired items with replacement."""
    rng = np.random.default_rng(seed)
    diffs = {s: np.asarray(b, float) - np.asarray(a, float) for s, (b, a) in pairs.items()}
    keys = sorted(diffs)
    point = float(np.mean(np.concatenate([diffs[s] for s in keys])))
    reps = np.empty(n_boot)
    for i in range(n_boot):
        drawn = rng.choice(len(keys), size=len(keys), replace=True)
        reps[i] = np.mean(np.concatenate([rng.choice(diffs[keys[j]], size=len(diffs[keys[j]]), replace=True)
                                          for j in drawn]))
    return point, float(np.quantile(reps, 0.025)), float(np.quantile(reps, 0.975))


def plot(curves, seeds, path: Path, against: str, arm: str) -> None:
    """Each seed's held-out accuracy per cycle, both arms (one panel a seed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(seeds), figsize=(4 * len(seeds), 3.2), sharey=True, squeeze=False)
    for ax, s in zip(axes[0], seeds):
        for key, label, style in (("base", against, "o-"), ("trained", arm, "s--")):
            ys = [100 * float(np.mean(list(items.values()))) for items in curves[(key, s)]]
            ax.plot(range(len(ys)), ys, style, label=label)
        ax.set_title(f"seed {s}")
        ax.set_xlabel("cycle")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("held-out accuracy (%)")
    axes[0][0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", default="/work/runs")
    ap.add_argument("--seeds", default="0")
    ap.add_argument("--prefix", default="mgr2", help="mgr: round 1's homes")
    ap.add_argument("--arm", default="trained", help="the arm compared (home mgr-ARM-sS)")
    ap.add_argument("--against", default="base", help="the arm it is compared with")
    ap.add_argument("--per-seed", action="store_true", help="also each seed's difference at the last cycle")
    ap.add_argument("--runs-level", action="store_true", help="also the last cycle's two-level (seed, item) bootstrap")
    ap.add_argument("--trained-prefix", default=None, help="the compared arm's home prefix (default: --prefix)")
    ap.add_argument("--csv", default=None, help="write each arm's held-out counts per seed and cycle here")
    ap.add_argument("--items", default=None, help="write each arm's held-out answers item by item here")
    ap.add_argument("--from-items", default=None, help="read an arm and seed found in this --items file from it")
    a = ap.parse_args()
    runs, seeds = Path(a.runs), [int(s) for s in a.seeds.split(",")]
    stored = read_items(Path(a.from_items)) if a.from_items else {}

    def arm_curve(arm: str, prefix: str, s: int) -> list[dict[str, bool]]:
        return stored[(arm, s)] if (arm, s) in stored else curve(runs / f"{prefix}-{arm}-s{s}")

    curves = {("base", s): arm_curve(a.against, a.prefix, s) for s in seeds}
    curves |= {("trained", s): arm_curve(a.arm, a.trained_prefix or a.prefix, s) for s in seeds}
    if a.items:
        write_items(Path(a.items), {((a.against if k == "base" else a.arm), s): v for (k, s), v in curves.items()})
    cycles = min(len(v) for v in curves.values())
    if a.csv:
        with open(a.csv, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["arm", "seed", "cycle", "n", "correct"])
            for (arm, s), per_cycle in sorted(curves.items(), key=lambda kv: (kv[0][0] != "base", kv[0][1])):
                for k, items in enumerate(per_cycle):
                    w.writerow([a.against if arm == "base" else a.arm, s, k, len(items), sum(map(bool, items.values()))])
        plot(curves, seeds, Path(a.csv).with_suffix(".png"), a.against, a.arm)
    print(f"| cycle | {a.against} | {a.arm} | {a.arm} - {a.against} (paired) |\n|---|---|---|---|")
    for k in range(cycles):
        xa, xb = [], []
        for s in seeds:
            a_items, b_items = curves[("base", s)][k], curves[("trained", s)][k]
            if not a_items or not b_items:
                continue
            for item in sorted(a_items.keys() & b_items.keys()):
                xa.append(float(a_items[item]))
                xb.append(float(b_items[item]))
        if not xa:
            continue
        d = paired_bootstrap(xb, xa)
        print(f"| {k} | {100 * np.mean(xa):.1f}% | {100 * np.mean(xb):.1f}% | {100 * d[0]:+.1f} [{100 * d[1]:+.1f}, {100 * d[2]:+.1f}] (n={len(xa)}) |")
    if a.per_seed:
        for s in seeds:
            a_items, b_items = curves[("base", s)][cycles - 1], curves[("trained", s)][cycles - 1]
            keys = sorted(a_items.keys() & b_items.keys())
            d = paired_bootstrap([float(b_items[i]) for i in keys], [float(a_items[i]) for i in keys])
            print(f"seed {s}, cycle {cycles - 1}: {100 * d[0]:+.1f} [{100 * d[1]:+.1f}, {100 * d[2]:+.1f}] (n={len(keys)})")
    if a.runs_level:
        pairs = {}
        for s in seeds:
            a_items, b_items = curves[("base", s)][cycles - 1], curves[("trained", s)][cycles - 1]
            keys = sorted(a_items.keys() & b_items.keys())
            pairs[s] = ([float(b_items[i]) for i in keys], [float(a_items[i]) for i in keys])
        d = two_level_bootstrap(pairs)
        print(f"cycle {cycles - 1}, seeds and items drawn ({len(seeds)} seeds): "
              f"{100 * d[0]:+.1f} [{100 * d[1]:+.1f}, {100 * d[2]:+.1f}]")


if __name__ == "__main__":
    main()
