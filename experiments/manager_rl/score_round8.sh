#!/bin/bash
# Round 8: teach the co-trained manager's score back on its worker's own rollouts. One best_of_n update of
# the manager the home serves (round 7 seed 0's last, m-42a3e641f7ba) on 32 fresh training-side failures
# and as many accepted answers, up to 4 per task (round 7b had one per task: 6 in all).
set -euo pipefail
H=${H:-/work/runs/mgr8-gate-s0}
CODE=${CODE:-$(cd "$(dirname "$0")/../.." && pwd)}
PY=${PY:-/work/main/.venv/bin/python}
export PYTHONPATH=$CODE TENTALIS_DATA_DIR=${TENTALIS_DATA_DIR:-/work/shared/data} MKL_NUM_THREADS=1 OMP_NUM_THREADS=1 TENTALIS_HOME=$H
unset DAGSTER_HOME
cd "$CODE"
T="$PY -m tentalis_pipelines.cli"
$T manager train --updates 1 --failures 32 --num-generations 6 --rescue-samples 4 --learning-rate 2e-4 \
  --reward dense --success-share 1.0 --accepted-per-task 4 --hint-prefix "First compute" --manager-temperature 0.8 --seed 8 \
  --update best_of_n --best-min-value 0.881 --num-iterations 4 --per-step-rows 8
