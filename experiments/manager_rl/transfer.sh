#!/bin/bash
# Usage: RUNS=<folder of the mgr-* homes> experiments/manager_rl/transfer.sh
# The manager comparison on the transfer set: the base model once, and every checkpoint of each worker home.
cd "$(dirname "$0")/../.."  # the repository root
RUNS=${RUNS:-/work/runs}
for h in mgr-base-s0 mgr-trained-s0 mgr-base-s1 mgr-trained-s1; do
  H=$RUNS/$h
  cids=$(TENTALIS_HOME=$H .venv/bin/python -c "
from tentalis_pipelines.lakehouse import Lakehouse
lake = Lakehouse('$H/lakehouse')
have = {r['checkpoint_id'] for r in lake.read('benchmark_results').to_pylist() if r['benchmark'] == 'arithmetic-transfer'}
ck = [c['checkpoint_id'] for c in sorted(lake.read('checkpoints').to_pylist(), key=lambda r: r['created_at'])]
todo = ([] if '$h' != 'mgr-base-s0' else ['base']) + ck
print(' '.join(c for c in todo if c not in have))")
  for cid in $cids; do
    echo "$h: $cid on arithmetic-transfer"
    env -u DAGSTER_HOME TENTALIS_HOME=$H PYTHONPATH=$PWD OMP_NUM_THREADS=1 .venv/bin/python -m tentalis_pipelines.cli benchmark --checkpoint $cid --benchmark arithmetic-transfer --format json 2>&1 | grep '^{'
  done
done
echo DONE
