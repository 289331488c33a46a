#!/bin/bash
# Round 8: teach the co-trained manager's score back on its worker's own rollouts. One best_of_n update of
# round 7 seed 0's last manager (m-42a3e641f7ba, promoted first) on 32 fresh training-side failures and as many
# accepted answers, up to 4 per task (round 7b had one per task: 6 in all), then the untrained manager serves
# again (eval_round8.sh and gate_round8.py compare against it). TARGETS: sampled (8a) | verifier (8b, and 8c with
# PARENT=m-9214a7b0cba4: a second verifier-score update chained on 8b).
set -euo pipefail
H=${H:-/work/runs/mgr8-gate-s0}
CODE=${CODE:-$(cd "$(dirname "$0")/../.." && pwd)}
PY=${PY:-/work/main/.venv/bin/python}
export PYTHONPATH=$CODE TENTALIS_DATA_DIR=${TENTALIS_DATA_DIR:-/work/shared/data} MKL_NUM_THREADS=1 OMP_NUM_THREADS=1 TENTALIS_HOME=$H
unset DAGSTER_HOME
cd "$CODE"
T="$PY -m tentalis_pipelines.cli"
$T promote ${PARENT:-m-42a3e641f7ba} --role manager --reason "round 8: the parent of a score update"
$T manager train --updates 1 --failures 32 --num-generations 6 --rescue-samples 4 --learning-rate 2e-4 \
  --reward dense --success-share 1.0 --accepted-per-task 4 --hint-prefix "First compute" --manager-temperature 0.8 --seed 8 \
  --update best_of_n --score-targets ${TARGETS:-sampled} --best-min-value 0.881 --num-iterations 4 --per-step-rows 8
$T rollback --role manager --to base --reason "round 8: gate candidates against the untrained manager"
