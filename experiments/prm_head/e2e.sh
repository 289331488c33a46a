#!/bin/bash
# Issue 31, must-hold 1 through the product: `tentalis prm train` with its defaults, then `tentalis prm eval` on
# ProcessBench, in a fresh home per seed; each phase timed. One line per seed goes to e2e.csv.
# Usage: e2e.sh SEED [TRAIN_PROBLEMS] [SPLITS]   (defaults: the product's (`tentalis prm train`'s), gsm8k)
set -euo pipefail
SEED=$1; N=${2:-default}; SPLITS=${3:-gsm8k}
HERE=$(cd "$(dirname "$0")" && pwd); CODE=$(cd "$HERE/../.." && pwd)
PY=${PY:-$CODE/.venv/bin/python}
export TENTALIS_HOME=${RUNS:-/tmp}/prm-e2e-s$SEED-n$N${TAG:+-$TAG} TENTALIS_DATA_DIR=${TENTALIS_DATA_DIR:-$CODE/../shared/data}
unset DAGSTER_HOME
rm -rf "$TENTALIS_HOME"; mkdir -p "$TENTALIS_HOME"
cd "$CODE"
t0=$(date +%s.%N)
$PY -m tentalis_pipelines.cli prm train $([ "$N" = default ] || echo --train-problems "$N") --seed "$SEED" --no-rollouts ${PRM_TRAIN_FLAGS:-}
t1=$(date +%s.%N)
$PY -m tentalis_pipelines.cli prm eval --split "$SPLITS" --rollouts 0 --no-agreement | tee "$TENTALIS_HOME/eval.txt"
t2=$(date +%s.%N)
$PY - "$SEED" "$N" "$t0" "$t1" "$t2" "$HERE/e2e.csv" <<'PYEOF'
import csv, json, os, re, sys, subprocess
from pathlib import Path
seed, n, t0, t1, t2, out = sys.argv[1:]
home = Path(os.environ["TENTALIS_HOME"])
man = json.loads(sorted((home / "reviewers" / "prm_head").glob("v*/manifest.json"))[-1].read_text())
rows = re.findall(r"│\s*(\w+)\s*│\s*(\d+)\s*│\s*([\d.]+)\s*│\s*([\d.]+)\s*│\s*([\d.]+)\s*│", (home / "eval.txt").read_text())
load = open("/proc/loadavg").read().split()[0]
new = not Path(out).exists()
with open(out, "a", newline="") as fh:
    w = csv.writer(fh)
    if new:
        w.writerow(["seed", "train_problems", "features", "threshold_from", "solutions", "refused", "threshold", "held_out_f1", "split", "n",
                    "acc_erroneous", "acc_correct", "f1", "train_s", "eval_s", "total_s", "load_at_end", "commit"])
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    for split, m, err, cor, f1 in rows:
        w.writerow([seed, man["settings"]["train_problems"], man["config"].get("features", "hidden"), man.get("threshold_from", "held-out slice"), man["lineage"]["labels"]["solutions"],
                    len(man["lineage"]["contamination"]["refused"]), round(man["threshold"], 3), round(100 * man["held_out_f1"], 1),
                    split, m, err, cor, f1, round(float(t1) - float(t0)), round(float(t2) - float(t1)),
                    round(float(t2) - float(t0)), load, commit])
print(f"seed {seed}: train {float(t1) - float(t0):.0f} s, eval {float(t2) - float(t1):.0f} s", rows)
PYEOF
