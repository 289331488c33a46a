#!/bin/bash
# Round 18: each run's last worker checkpoint on 512 held-out arithmetic items (the first 64 are the usual held-out set),
# in a copy of its home under $RUNS/wide/ (the lakehouse and Dagster storage copied, checkpoints and models linked), so
# the run's own 64-item rows stay as they were. `round2_workers --runs $RUNS/wide` then pairs them by item.
# Usage: RUNS=/work/runs experiments/manager_rl/wide_heldout.sh mgr18-base-s0 mgr18-trained-s0 ...   (LIMIT: 512)
set -euo pipefail
cd "$(dirname "$0")/../.."  # the repository root
RUNS=${RUNS:-/work/runs}
export PYTHONPATH=$PWD TENTALIS_DATA_DIR=${TENTALIS_DATA_DIR:-/work/shared/data} OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
unset DAGSTER_HOME
for h in "$@"; do
  src=$(readlink -f "$RUNS/$h"); dst=$RUNS/wide/$h
  rm -rf "$dst"; mkdir -p "$dst"
  for f in "$src"/*; do
    case $(basename "$f") in lakehouse|dagster) cp -a "$f" "$dst/" ;; *) ln -s "$f" "$dst/" ;; esac
  done
  cid=$(.venv/bin/python -m experiments.manager_rl.newest "$dst" --role worker)
  echo "$h $cid"
  TENTALIS_HOME=$dst .venv/bin/python -m tentalis_pipelines.cli benchmark --checkpoint "$cid" --benchmark arithmetic \
    --limit "${LIMIT:-512}" --format json 2>&1 | grep '^{'
done
