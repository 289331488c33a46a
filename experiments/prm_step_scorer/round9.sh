#!/bin/bash
# Round 9: round 8's head retrained once right rollouts are labelled too (the calculator vouches for a rollout with
# a right answer and only true equations, commit 1a974c6), in a copy of round 8's source home (round8_source.sh):
# `tentalis prm train` (defaults) and `tentalis prm eval` on ProcessBench GSM8K, timed, then the learning round,
# seeds 0 and 1 side by side, against round 2's calculator arm (summarize.py --round 9).
# Usage: RUNS=<folder> TENTALIS_DATA_DIR=<data> experiments/prm_step_scorer/round9.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
RUNS=${RUNS:-/work/runs}
export TENTALIS_DATA_DIR=${TENTALIS_DATA_DIR:?}
unset DAGSTER_HOME
T=".venv/bin/python -m tentalis_pipelines.cli"
rm -rf "$RUNS/prm9-src"; cp -r "$RUNS/prm8-src" "$RUNS/prm9-src"; rm -rf "$RUNS/prm9-src/reviewers"
t0=$(date +%s)
TENTALIS_HOME=$RUNS/prm9-src OMP_NUM_THREADS=2 $T prm train --features hidden --seed 0
t1=$(date +%s)
TENTALIS_HOME=$RUNS/prm9-src OMP_NUM_THREADS=2 $T prm eval --split gsm8k --rollouts 0 --no-agreement
t2=$(date +%s)
echo "prm train $((t1 - t0)) s, prm eval $((t2 - t1)) s"
rm -rf "$RUNS/prm9_s0" "$RUNS/prm9_s1"
RUNS=$RUNS ROUND=9 HEAD_FROM=$RUNS/prm9-src experiments/prm_step_scorer/run.sh 0 &
RUNS=$RUNS ROUND=9 HEAD_FROM=$RUNS/prm9-src experiments/prm_step_scorer/run.sh 1 &
wait
echo "round 9 learn done $(( $(date +%s) - t2 )) s"
