#!/bin/bash
# usage: arm.sh NAME SEED WARM(0|1) -- learn args...
name=$1; seed=$2; warm=$3; shift 3
home=${RUNS:-/tmp/tentalis-runs}/$name
mkdir -p "$home"
export TENTALIS_HOME=$home OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
cd "$(dirname "$0")/../.."
{
echo "start $(date +%s) $(date)"
.venv/bin/tentalis init
if [ "$warm" = 1 ]; then
  .venv/bin/tentalis warmstart --tasks terminal --levels 1 --num-tasks ${WS_TASKS:-96} --epochs ${WS_EPOCHS:-4} --learning-rate ${WS_LR:-5e-4} --seed 0 --run-seed $seed --hold-out-kind last_line
  echo "warm_done $(date +%s)"
fi
.venv/bin/tentalis learn --tasks terminal --levels 1 --hold-out-kind last_line --seed $seed "$@"
echo "end $(date +%s) $(date)"
} > $home.log 2>&1
