"""The transfer set, paired: each seed's last checkpoint of arm B against arm A's on ``arithmetic-transfer``
(the benchmark rows ``transfer_last.sh`` wrote), items paired within a seed, the paired bootstrap of B - A.

Each seed's B - A is printed too, and with several seeds the two-level (seed, item) bootstrap of round 4.

A home that is gone can be read from a committed item file (``--from-items F``: rows arm, seed, item, correct, the
arm being the prefix's last part, ``mgr24-base`` -> ``base``); ``--items F`` writes every answer read that way.

Usage: python -m experiments.manager_rl.transfer_pairs [--runs /work/runs] [--seeds 0,1,2,3] [--from-items F]
       [--items F] A_PREFIX B_PREFIX
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

from experiments.manager_rl.round2_workers import two_level_bootstrap
from tentalis_pipelines.lakehouse import Lakehouse
from tentalis_pipelines.promotion import item_correctness
from tentalis_pipelines.statistics import paired_bootstrap


def last_checkpoint_items(home: Path) -> dict[str, bool]:
    lake = Lakehouse(home / "lakehouse")
    c = max(lake.read("checkpoints").to_pylist(), key=lambda r: r["created_at"])["checkpoint_id"]
    return item_correctness(lake, c, "arithmetic-transfer")


def read_items(path: Path) -> dict[tuple[str, int], dict[str, bool]]:
    """An item file's answers: (arm, seed) -> item -> correct."""
    out: dict[tuple[str, int], dict[str, bool]] = {}
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            out.setdefault((r["arm"], int(r["seed"])), {})[r["item"]] = r["correct"] == "1"
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", default="/work/runs")
    ap.add_argument("--seeds", default="0,1,2,3")
    ap.add_argument("--from-items", default=None, help="read an arm and seed found in this item file from it")
    ap.add_argument("--items", default=None, help="write every answer read (arm, seed, item, correct) here")
    ap.add_argument("a")
    ap.add_argument("b")
    args = ap.parse_args()
    stored = read_items(Path(args.from_items)) if args.from_items else {}
    read: dict[tuple[str, int], dict[str, bool]] = {}

    def items(prefix: str, s: int) -> dict[str, bool]:
        arm = prefix.rsplit("-", 1)[-1]
        read[(arm, s)] = stored.get((arm, s)) or last_checkpoint_items(Path(args.runs) / f"{prefix}-s{s}")
        return read[(arm, s)]

    a_all, b_all, pairs = [], [], {}
    for s in map(int, args.seeds.split(",")):
        a, b = items(args.a, s), items(args.b, s)
        keys = sorted(set(a) & set(b))
        pa, pb = [float(a[k]) for k in keys], [float(b[k]) for k in keys]
        pairs[s] = (pb, pa)
        a_all += pa
        b_all += pb
        m, lo, hi = paired_bootstrap(pb, pa)
        print(f"seed {s}: {args.a} {100 * sum(pa) / len(pa):.1f}% {args.b} {100 * sum(pb) / len(pb):.1f}% "
              f"(n = {len(keys)}): B - A {100 * m:+.1f} [{100 * lo:+.1f}, {100 * hi:+.1f}]")
    mean, lo, hi = paired_bootstrap(b_all, a_all)
    print(f"{args.b} {int(sum(b_all))}/{len(b_all)} vs {args.a} {int(sum(a_all))}/{len(a_all)}: "
          f"B - A {100 * mean:+.1f} points [{100 * lo:+.1f}, {100 * hi:+.1f}]")
    if len(pairs) > 1:
        mean, lo, hi = two_level_bootstrap(pairs)
        print(f"seeds and items drawn: B - A {100 * mean:+.1f} [{100 * lo:+.1f}, {100 * hi:+.1f}]")
    if args.items:
        with open(args.items, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["arm", "seed", "item", "correct"])
            for (arm, s), answers in sorted(read.items()):
                w.writerows([arm, s, item, int(answers[item])] for item in sorted(answers))


if __name__ == "__main__":
    main()
