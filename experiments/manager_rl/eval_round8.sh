#!/bin/bash
# Round 8: the manager gate's score checks on a held-out set with enough accepted answers. The home is a copy
# of round 7 seed 0's (its cycle-4 co-trained worker serves) plus 416 tasks x 8 samples run under that worker
# (`tentalis run --no-train`, seeds 700001-700003). Each manager gets one greedy review per held-out failure
# (8 rescue samples) and per held-out accepted answer (up to 2 per task, 60 in all).
# Usage: eval_round8.sh CHECKPOINT...   (H: the home; the serving manager is rolled back to base first)
set -euo pipefail
H=${H:-/work/runs/mgr8-gate-s0}
CODE=${CODE:-$(cd "$(dirname "$0")/../.." && pwd)}
PY=${PY:-/work/main/.venv/bin/python}
export PYTHONPATH=$CODE TENTALIS_DATA_DIR=${TENTALIS_DATA_DIR:-/work/shared/data} MKL_NUM_THREADS=1 OMP_NUM_THREADS=1 TENTALIS_HOME=$H
unset DAGSTER_HOME
cd "$CODE"
T="$PY -m tentalis_pipelines.cli"
for M in "$@"; do
  $T manager evaluate --checkpoint "$M" --eval-rescue-samples 8 --hint-prefix "First compute" --accepted-per-task 2 --eval-accepted 60
done
