#!/bin/bash
# Round 8: round 7's source home (round7_source.sh) continued on task seeds 109-120, 24 level-1 tasks x 8 samples
# a cycle, calculator, outcome mode, so that its lakehouse holds about a thousand consensus-labelled rollouts of
# problems the learning runs never train on; then `tentalis prm train` (defaults: hidden state, the rollouts
# weighted 10 and in both renderings) and `tentalis prm eval` on ProcessBench GSM8K, timed. Other labelled draws:
# SRC=prm8-src round7_draws.sh SEED. The learning round: ROUND=8 HEAD_FROM=$RUNS/prm8-src run.sh SEED.
# Usage: RUNS=<folder> TENTALIS_DATA_DIR=<data> experiments/prm_step_scorer/round8_source.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
RUNS=${RUNS:-/work/runs}
export TENTALIS_HOME=$RUNS/prm8-src TENTALIS_DATA_DIR=${TENTALIS_DATA_DIR:?}
unset DAGSTER_HOME
T=".venv/bin/python -m tentalis_pipelines.cli"
rm -rf "$TENTALIS_HOME"; cp -r "$RUNS/prm7-src" "$TENTALIS_HOME"; rm -rf "$TENTALIS_HOME/reviewers"
for s in 109 110 111 112 113 114 115 116 117 118 119 120; do $T run --seed $s --num-tasks 24 --num-generations 8 --levels 1; done
t0=$(date +%s)
$T prm train --features hidden --seed 0
t1=$(date +%s)
$T prm eval --split gsm8k --rollouts 0 --no-agreement
t2=$(date +%s)
echo "prm train $((t1 - t0)) s, prm eval $((t2 - t1)) s"
