#!/bin/bash
# Usage: RUNS=<folder> experiments/prm_step_scorer/run.sh SEED
# Both arms of one seed, side by side, one thread each: the PRM head (trained once, in prm_s0, and copied
# so that every seed scores with the same head) against the calculator, in process mode.
set -euo pipefail
cd "$(dirname "$0")/../.."
RUNS=${RUNS:-/work/runs}
S=$1
if [ ! -d "$RUNS/prm_s0/reviewers/prm_head" ]; then
  TENTALIS_DATA_DIR=${TENTALIS_DATA_DIR:?} .venv/bin/tentalis prm train --home "$RUNS/prm_s0" --train-problems 600 --no-embeddings --no-rollouts
fi
[ "$S" = 0 ] || { mkdir -p "$RUNS/prm_s$S"; cp -r "$RUNS/prm_s0/reviewers" "$RUNS/prm_s$S/"; }
OMP_NUM_THREADS=1 .venv/bin/tentalis learn --cycles 8 --seed "$S" --advantage-mode process --step-scorer prm_head --home "$RUNS/prm_s$S" > "$RUNS/learn_prm_head_s$S.log" 2>&1 &
OMP_NUM_THREADS=1 .venv/bin/tentalis learn --cycles 8 --seed "$S" --advantage-mode process --step-scorer calculator --home "$RUNS/calculator_s$S" > "$RUNS/learn_calculator_s$S.log" 2>&1 &
wait
