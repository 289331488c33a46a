"""Summarise the runs of one label in experiments/learning_curve/learning_runs.csv as the README's Markdown tables.

    .venv/bin/python -m experiments.learning_curve.summarize --label "final code (bf16 gen+train, fixed rewards)"

Prints two tables: per seed, when the run first reached +20 and +30 points over base with the paired
95% interval above zero (and its final checkpoint); per checkpoint, the mean strict accuracy across
seeds with the spread (min-max) and the mean minutes since the run started.
"""

from __future__ import annotations

import argparse
import csv
import statistics
from collections import defaultdict
from pathlib import Path


def _f(value: str) -> float | None:
    return float(value) if value not in ("", None) else None


def first_reaching(rows: list[dict], points: float) -> dict | None:
    """The first checkpoint whose gain over base is >= ``points`` with its paired interval above zero."""
    for r in rows:
        diff, low = _f(r["vs_base"]), _f(r["vs_base_ci_low"])
        if diff is not None and low is not None and diff * 100 >= points - 1e-9 and low > 0:
            return r
    return None


def summarize(rows: list[dict]) -> str:
    by_seed: dict[int, list[dict]] = defaultdict(list)
    for r in rows:
        by_seed[int(r["seed"])].append(r)
    for seed_rows in by_seed.values():
        seed_rows.sort(key=lambda r: int(r["checkpoint"]))

    def at(r: dict | None) -> str:
        if r is None:
            return "not reached"
        return (f"ckpt {r['checkpoint']}, {float(r['minutes']):.1f} min "
                f"(+{float(r['vs_base']) * 100:.1f} [+{float(r['vs_base_ci_low']) * 100:.1f}, +{float(r['vs_base_ci_high']) * 100:.1f}])")

    lines = ["| seed | base | final (ckpt 12) | +20 points, interval > 0 | +30 points, interval > 0 |", "|---|---|---|---|---|"]
    for seed, seed_rows in sorted(by_seed.items()):
        base, last = seed_rows[0], seed_rows[-1]
        lines.append(f"| {seed} | {float(base['accuracy']) * 100:.1f}% | {float(last['accuracy']) * 100:.1f}% at "
                     f"{float(last['minutes']):.1f} min | {at(first_reaching(seed_rows, 20))} | {at(first_reaching(seed_rows, 30))} |")
    lines += ["", "| checkpoint | mean accuracy (min-max over seeds) | mean gain over base | mean minutes |", "|---|---|---|---|"]
    by_ckpt: dict[int, list[dict]] = defaultdict(list)
    for r in rows:
        by_ckpt[int(r["checkpoint"])].append(r)
    for ckpt, ck_rows in sorted(by_ckpt.items()):
        acc = [float(r["accuracy"]) * 100 for r in ck_rows]
        gains = [float(r["vs_base"]) * 100 for r in ck_rows if r["vs_base"] != ""]
        gain = f"+{statistics.mean(gains):.1f}" if gains else ""
        mins = statistics.mean(float(r["minutes"]) for r in ck_rows)
        name = "base" if ckpt == 0 else str(ckpt)
        lines.append(f"| {name} | {statistics.mean(acc):.1f}% ({min(acc):.1f}-{max(acc):.1f}) | {gain} | {mins:.1f} |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--csv", type=Path, default=Path(__file__).resolve().parent / "learning_runs.csv")
    p.add_argument("--label", required=True, help="Summarise only the runs with this label.")
    args = p.parse_args()
    with args.csv.open() as f:
        rows = [r for r in csv.DictReader(f) if r["label"] == args.label]
    if not rows:
        raise SystemExit(f"no rows labelled {args.label!r} in {args.csv}")
    print(summarize(rows))


if __name__ == "__main__":
    main()
