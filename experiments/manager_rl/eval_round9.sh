#!/bin/bash
# Round 9: each seed's last co-trained manager (verifier score targets in the loop) on round 8's held-out set
# (a copy of mgr8-gate-s0: 104 held-out failures, 60 accepted answers), then the gate's decision against the
# untrained manager for each (gate_round8.py, the home serving the untrained manager).
# Usage: eval_round9.sh SEED...   (homes $RUNS/$PREFIX-cotrain-sSEED; writes $OUT.csv/.txt/.png beside this script,
# OUT=gate_round9 by default)
set -euo pipefail
RUNS=${RUNS:-/work/runs}
H=$RUNS/${PREFIX:-mgr9}-gate
CODE=${CODE:-$(cd "$(dirname "$0")/../.." && pwd)}
PY=${PY:-/work/main/.venv/bin/python}
export PYTHONPATH=$CODE TENTALIS_DATA_DIR=${TENTALIS_DATA_DIR:-/work/shared/data} MKL_NUM_THREADS=1 OMP_NUM_THREADS=1 TENTALIS_HOME=$H
unset DAGSTER_HOME
cd "$CODE"
T="$PY -m tentalis_pipelines.cli"
rm -rf "$H"; cp -r "$RUNS/mgr8-gate-s0" "$H"
newest() { $PY -m experiments.manager_rl.newest "$1" --role manager; }
MS=()
for S in "$@"; do
  M=$(newest "$RUNS/${PREFIX:-mgr9}-cotrain-s$S")
  $PY -m experiments.manager_rl.register --source "$RUNS/${PREFIX:-mgr9}-cotrain-s$S" --target "$H" --checkpoint "$M"
  MS+=("$M")
done
$T rollback --role manager --to base --reason "round 9: evaluate the co-trained managers against the untrained one"
for M in "${MS[@]}"; do
  $T manager evaluate --checkpoint "$M" --eval-rescue-samples 8 --hint-prefix "First compute" --accepted-per-task 2 --eval-accepted 60
done
D=experiments/manager_rl
O=$D/${OUT:-gate_round9}
$PY -m experiments.manager_rl.gate_round8 --home "$H" --csv $O.csv --figure $O.png "${MS[@]}" | tee $O.txt
