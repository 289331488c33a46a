#!/bin/bash
# Round 7: a hidden-state head that has also learned from the project's own reviewed rollouts.
# 1. A learning run of its own (`tentalis run`, 8 cycles of 8 level-1 tasks x 8 samples, calculator, outcome mode) on
#    task seeds 101-108, which no round's learning run trains on (they use seeds 1-8): its reviewed rollouts are the labels.
# 2. `tentalis prm train --features hidden` in that home (GSM8K train + the lakehouse's rollouts, the default), timed.
# 3. `tentalis prm eval` on ProcessBench GSM8K (must-hold 1), timed. Then: ROUND=7 HEAD_FROM=$RUNS/prm7-src run.sh SEED.
# Usage: RUNS=<folder> TENTALIS_DATA_DIR=<data> experiments/prm_step_scorer/round7_source.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
RUNS=${RUNS:-/work/runs}
export TENTALIS_HOME=$RUNS/prm7-src TENTALIS_DATA_DIR=${TENTALIS_DATA_DIR:?}
unset DAGSTER_HOME
T=".venv/bin/python -m tentalis_pipelines.cli"
rm -rf "$TENTALIS_HOME"; $T init > /dev/null
for s in 101 102 103 104 105 106 107 108; do $T run --seed $s --num-tasks 8 --num-generations 8 --levels 1; done
.venv/bin/python - "$RUNS" <<'PYEOF'
import sys
from tentalis_pipelines.lakehouse import Lakehouse
from tentalis_pipelines.reviewers.prm_reviewer import rollout_labels
runs = sys.argv[1]
src = Lakehouse(f"{runs}/prm7-src/lakehouse")
mine = {t["prompt"] for t in src.read("tasks").to_pylist()}
theirs = {t["prompt"] for t in Lakehouse(f"{runs}/calculator2_s0/lakehouse").read("tasks").to_pylist()}
sols, _ = rollout_labels(src)
print(f"source tasks {len(mine)}, shared with the learning runs' tasks {len(mine & theirs)}; consensus-labelled rollouts {len(sols)}, "
      f"steps {sum(len(s.labels) for s in sols)}, correct steps {sum(sum(s.labels) for s in sols)}")
PYEOF
t0=$(date +%s)
$T prm train --features hidden --seed 0
t1=$(date +%s)
$T prm eval --split gsm8k --rollouts 0 --no-agreement
t2=$(date +%s)
echo "prm train $((t1 - t0)) s, prm eval $((t2 - t1)) s"
