#!/bin/bash
# Round 7, must-hold 1 across labelled draws: round 7's recipe (`tentalis prm train --features hidden`, GSM8K train plus
# the source run's reviewed rollouts) with another GSM8K sample (--seed S), in a copy of the source home, then
# `tentalis prm eval` on ProcessBench GSM8K. Round 8: SRC=prm8-src (round8_source.sh; `prm train`'s defaults then
# weigh the rollouts). Usage: RUNS=<folder> TENTALIS_DATA_DIR=<data> [SRC=prm7-src] round7_draws.sh SEED
set -euo pipefail
cd "$(dirname "$0")/../.."
RUNS=${RUNS:-/work/runs}; S=$1; SRC=${SRC:-prm7-src}
export TENTALIS_HOME=$RUNS/$SRC-s$S TENTALIS_DATA_DIR=${TENTALIS_DATA_DIR:?} OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
unset DAGSTER_HOME
rm -rf "$TENTALIS_HOME"; cp -r "$RUNS/$SRC" "$TENTALIS_HOME"; rm -rf "$TENTALIS_HOME/reviewers"
T=".venv/bin/python -m tentalis_pipelines.cli"
t0=$(date +%s)
$T prm train --features hidden --seed "$S"
$T prm eval --split gsm8k --rollouts 0 --no-agreement
echo "seed $S: train and eval $(( $(date +%s) - t0 )) s"
