"""Reviews that teach, measured: RL alone, OPD alone, RL+OPD and RL+OPD+skills, side by side.

Each run is `tentalis learn --method M [--skills] --seed S` in a fresh home; its held-out curve (one row
per checkpoint: method, skills, seed, cycle, strict and lenient accuracy with the item count) is appended
to a CSV, so runs made at different times add up to the README's table.

    .venv/bin/python -m experiments.method_comparison.run run --method combine --seed 0 --cycles 8
    .venv/bin/python -m experiments.method_comparison.run run --method combine --skills --seed 1 --cycles 8
    .venv/bin/python -m experiments.method_comparison.run summarize          # the README table

The summary pools the held-out items of every seed of a (method, cycle) (2 seeds x 64 items = 128) and
gives the strict accuracy with a 95% Wilson interval, plus the first cycle at which each method reaches
RL's final accuracy.
"""

from __future__ import annotations

import argparse
import csv
import os
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]

FIELDS = ["method", "skills", "task_set", "seed", "cycle", "checkpoint_id", "n", "accuracy", "lenient_accuracy", "format_rate",
          "ci_low", "ci_high", "vs_base", "vs_base_ci_low", "vs_base_ci_high", "promoted", "minutes", "commit", "label"]
DEFAULT_OUT = HERE / "method_runs.csv"


def run(args) -> None:
    from tentalis_pipelines.evaluation.learning_runs import rows_for

    home = Path(args.home) if args.home else Path(tempfile.mkdtemp(prefix=f"tentalis-{args.method}-s{args.seed}-"))
    # This checkout's code (also when it is a worktree other than the one the venv was installed from).
    env = {**{k: v for k, v in os.environ.items() if k != "DAGSTER_HOME"}, "TENTALIS_HOME": str(home),
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    tentalis = [sys.executable, "-m", "tentalis_pipelines.cli"]
    cmd = [*tentalis, "learn", "--cycles", str(args.cycles), "--method", args.method, "--seed", str(args.seed), "--tasks", args.tasks]
    cmd += args.learn_args
    if args.skills:
        cmd.append("--skills")
    if args.gate_limit:
        cmd += ["--gate-limit", str(args.gate_limit)]
    t0 = time.time()
    model = ["--model", os.environ["TENTALIS_MODEL"]] if os.environ.get("TENTALIS_MODEL") else []
    if not args.export_only:
        subprocess.run([*tentalis, "init", *model], env=env, check=True, cwd=ROOT)
        print("$", " ".join(cmd), f"(home {home})", flush=True)
        subprocess.run(cmd, env=env, check=True, cwd=ROOT)
    # Each row's commit is the code that trained its checkpoint (its lineage), not this checkout's HEAD at
    # export time: an exported home may have run from another worktree or an older commit.
    commit = args.code_commit
    label = args.label or f"{args.method}{'+skills' if args.skills else ''} seed {args.seed}"
    rows = []
    for r in rows_for(home, args.seed, label, commit, benchmark=args.tasks):
        n = _items(home, r["checkpoint_id"], args.tasks)
        rows.append({"method": args.method, "skills": bool(args.skills), "task_set": args.tasks, "seed": args.seed,
                     "cycle": r["cycle"], "checkpoint_id": r["checkpoint_id"], "n": n, "accuracy": r["accuracy"],
                     "lenient_accuracy": r["lenient_accuracy"], "format_rate": r["format_rate"], "ci_low": r["ci_low"],
                     "ci_high": r["ci_high"], "vs_base": r["vs_base"], "vs_base_ci_low": r["vs_base_ci_low"],
                     "vs_base_ci_high": r["vs_base_ci_high"], "promoted": r["promoted"], "minutes": r["minutes"],
                     "commit": r["commit"], "label": label})
    out = Path(args.out)
    # A resumed home is exported again: its rows replace the ones exported before (same method, skills,
    # task set, seed and cycle), so a run continued in a later session adds up without duplicates.
    kept = []
    if out.exists():
        with out.open() as fh:
            fresh = {_key(r) for r in rows}
            kept = [r for r in csv.DictReader(fh) if _key(r) not in fresh]
    with out.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=FIELDS)
        w.writeheader()
        w.writerows(kept + rows)
    print(f"{len(rows)} rows -> {out} ({(time.time() - t0) / 60:.1f} min)")


def _key(r: dict) -> tuple:
    return (r["method"], str(r["skills"]), r["task_set"], str(r["seed"]), str(r["cycle"]))


def _items(home: Path, checkpoint_id: str, benchmark: str = "arithmetic") -> int:
    from tentalis_pipelines.lakehouse import Lakehouse

    rows = Lakehouse(home / "lakehouse").read("benchmark_results").to_pylist()
    return next(int(r["n"]) for r in rows if r["checkpoint_id"] == checkpoint_id and r["benchmark"] == benchmark)


def summarize(args) -> None:
    from tentalis_pipelines.statistics import wilson_interval

    with Path(args.out).open() as fh:
        rows = list(csv.DictReader(fh))
    rows = [r for r in rows if r["task_set"] == args.tasks]
    by = defaultdict(list)
    for r in rows:
        name = r["method"] + ("+skills" if r["skills"] == "True" else "")
        by[(name, int(r["cycle"]))].append(r)
    methods = [m for m in ("rl", "opd", "combine", "combine+skills") if any(k[0] == m for k in by)]
    cycles = sorted({c for _, c in by})
    key = "lenient_accuracy" if args.lenient else "accuracy"
    column_seeds = {m: len({r["seed"] for (mm, _), rs in by.items() if mm == m for r in rs}) for m in methods}
    print("| cycle | " + " | ".join(f"{m} ({column_seeds[m]} seeds)" for m in methods) + " |")
    print("|---|" + "---|" * len(methods))
    pooled, intervals = {}, {}
    for c in cycles:
        cells = []
        for m in methods:
            rs = by.get((m, c), [])
            if not rs:
                cells.append("")
                continue
            n = sum(int(r["n"]) for r in rs)
            k = round(sum(float(r[key]) * int(r["n"]) for r in rs))  # accuracies times n: whole counts, up to rounding
            lo, hi = wilson_interval(k, n)
            pooled[(m, c)] = k / n
            intervals[(m, c)] = (lo, hi)
            seeds = len({r["seed"] for r in rs})
            # A cell pooled over fewer seeds than its column (a run still going, or cut short) says so.
            short = f" ({seeds} seed{'s' if seeds > 1 else ''})" if seeds < column_seeds[m] else ""
            cells.append(f"{100 * k / n:.1f}% [{100 * lo:.1f}, {100 * hi:.1f}]{short}")
        print(f"| {'base' if c == 0 else c} | " + " | ".join(cells) + " |")
    if "rl" in methods:
        final = max(c for (m, c) in pooled if m == "rl")
        target = pooled[("rl", final)]
        print(f"\nRL's final accuracy (cycle {final}): {100 * target:.1f}%.")
        if ("rl", 0) in intervals:
            lo0, hi0 = intervals[("rl", 0)]
            # "Reaching RL's final accuracy" only means something when RL moved off its base.
            if lo0 - 1e-9 <= target <= hi0 + 1e-9:
                print(f"It lies inside RL's base interval [{100 * lo0:.1f}, {100 * hi0:.1f}]: RL did not measurably "
                      "improve, so the cycle at which a method reaches it carries no signal.")
        for m in methods:
            hit = next((c for c in cycles if c > 0 and pooled.get((m, c), -1) >= target - 1e-9), None)
            print(f"* {m}: {'reaches it at cycle ' + str(hit) if hit else 'does not reach it'}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--method", choices=["rl", "opd", "combine"], required=True)
    r.add_argument("--skills", action="store_true")
    r.add_argument("--seed", type=int, required=True)
    r.add_argument("--cycles", type=int, default=8)
    r.add_argument("--tasks", default="arithmetic")
    r.add_argument("--gate-limit", type=int, default=None)
    r.add_argument("--home", default=None)
    r.add_argument("--label", default=None)
    r.add_argument("--out", default=str(DEFAULT_OUT))
    r.add_argument("--export-only", action="store_true", help="only append the rows of an existing --home (e.g. a run cut short)")
    r.add_argument("--code-commit", default=None,
                   help="the commit whose code ran the home, only for checkpoints whose lineage records none")
    r.add_argument("learn_args", nargs="*", help="more `tentalis learn` options, after --")
    s = sub.add_parser("summarize")
    s.add_argument("--tasks", default="arithmetic")
    s.add_argument("--lenient", action="store_true")
    s.add_argument("--out", default=str(DEFAULT_OUT))
    args = ap.parse_args()
    run(args) if args.cmd == "run" else summarize(args)


if __name__ == "__main__":
    main()
