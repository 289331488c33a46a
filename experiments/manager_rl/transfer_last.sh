#!/bin/bash
# Usage: RUNS=<folder of the mgr-* homes> experiments/manager_rl/transfer_last.sh mgr-base-s0 mgr-trained-s0 ...
# The last checkpoint of each home (and the base model once, in mgr-base-s0) on arithmetic-transfer (round 3).
cd "$(dirname "$0")/../.."  # the repository root
RUNS=${RUNS:-/work/runs}
for h in "$@"; do
  H=$RUNS/$h
  cid=$(PYTHONPATH=$PWD .venv/bin/python -m experiments.manager_rl.newest "$H" --role worker)
  for c in $cid $( [ "$h" = mgr-base-s0 ] && echo base ); do
    echo "$h $c"
    env -u DAGSTER_HOME TENTALIS_HOME=$H PYTHONPATH=$PWD OMP_NUM_THREADS=1 .venv/bin/python -m tentalis_pipelines.cli benchmark --checkpoint $c --benchmark arithmetic-transfer --format json 2>&1 | grep '^{'
  done
done
