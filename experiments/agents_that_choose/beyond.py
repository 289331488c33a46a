"""Must-hold 4 of issue 72: the level-1 recipe's warm start on another level's own oracle demonstrations
(``run_beyond.sh``: terminal level 2, BFCL's generated level 1), per seed and pooled over seeds.

Per home: the base's and the warm-start checkpoint's held-out items on each benchmark the gate evaluated
(the level's held-out split), success with its Wilson 95% interval, and the checkpoint against the base
paired over (seed, item) with a bootstrap 95% interval. The base is the RL-alone control: on these
levels every group of the base fails (0 of 30 held-out), so RL alone never trains and its policy is the
base.

    PYTHONPATH=. .venv/bin/python -m experiments.agents_that_choose.beyond \
        --run terminal-l2:0=/tmp/tentalis-runs/l2_s0 --run terminal-l2:1=/tmp/tentalis-runs/l2_s1 \
        --run bfcl:0=/tmp/tentalis-runs/bfcl_s0 --run bfcl:1=/tmp/tentalis-runs/bfcl_s1
"""

from __future__ import annotations

import argparse
import csv
from collections import defaultdict
from pathlib import Path

from tentalis_pipelines.lakehouse import Lakehouse
from tentalis_pipelines.promotion import item_correctness
from tentalis_pipelines.statistics import paired_bootstrap, wilson_interval

HERE = Path(__file__).parent


def warm_start_checkpoint(lake: Lakehouse) -> dict:
    """The home's warm-start checkpoint row (``tentalis warmstart`` makes exactly one)."""
    rows = [r for r in lake.read("checkpoints").to_pylist() if r.get("algorithm") == "sft_warm_start"]
    if len(rows) != 1:
        raise SystemExit(f"{lake}: expected one warm-start checkpoint, found {len(rows)}")
    return rows[0]


def evaluated(lake: Lakehouse, checkpoint_id: str) -> list[str]:
    """The benchmarks ``checkpoint_id`` was evaluated on, sorted."""
    return sorted({r["benchmark"] for r in lake.read("benchmark_results", columns=["checkpoint_id", "benchmark"]).to_pylist()
                   if r["checkpoint_id"] == checkpoint_id})


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", action="append", required=True, help="NAME:SEED=HOME (a run_beyond.sh home)")
    ap.add_argument("--csv", type=Path, default=HERE / "agents_that_choose_beyond.csv")
    a = ap.parse_args(argv)
    rows, pooled = [], defaultdict(lambda: {"base": [], "warm": []})
    for spec in a.run:
        label, home = spec.split("=", 1)
        name, seed = label.split(":")
        lake = Lakehouse(str(Path(home) / "lakehouse"))
        ckpt = warm_start_checkpoint(lake)
        for bench in evaluated(lake, ckpt["checkpoint_id"]):
            base, warm = item_correctness(lake, "base", bench), item_correctness(lake, ckpt["checkpoint_id"], bench)
            items = sorted(set(base) & set(warm))
            if not items:
                continue
            b, w = [float(base[i]) for i in items], [float(warm[i]) for i in items]
            pooled[name, bench]["base"] += b
            pooled[name, bench]["warm"] += w
            lo, hi = wilson_interval(int(sum(w)), len(w))
            diff, dlo, dhi = paired_bootstrap(w, b, n_boot=10_000)
            rows.append({"run": name, "seed": seed, "benchmark": bench, "checkpoint_id": ckpt["checkpoint_id"],
                         "base_passed": int(sum(b)), "passed": int(sum(w)), "n": len(items), "wilson_low": round(lo, 4),
                         "wilson_high": round(hi, 4), "diff": round(diff, 4), "diff_low": round(dlo, 4), "diff_high": round(dhi, 4)})
    for (name, bench), d in sorted(pooled.items()):
        w, b = d["warm"], d["base"]
        lo, hi = wilson_interval(int(sum(w)), len(w))
        diff, dlo, dhi = paired_bootstrap(w, b, n_boot=10_000)
        rows.append({"run": name, "seed": "pooled", "benchmark": bench, "checkpoint_id": "", "base_passed": int(sum(b)),
                     "passed": int(sum(w)), "n": len(w), "wilson_low": round(lo, 4), "wilson_high": round(hi, 4),
                     "diff": round(diff, 4), "diff_low": round(dlo, 4), "diff_high": round(dhi, 4)})
    for r in rows:
        print(f"{r['run']:>12} seed {r['seed']:>6} {r['benchmark']:>16}: base {r['base_passed']}/{r['n']}, warm start "
              f"{r['passed']}/{r['n']} [{100 * r['wilson_low']:.1f}, {100 * r['wilson_high']:.1f}]; "
              f"{100 * r['diff']:+.1f} points [{100 * r['diff_low']:+.1f}, {100 * r['diff_high']:+.1f}]")
    with a.csv.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
