#!/bin/bash
# Must-hold 4 (issue 72): the level-1 recipe's warm start on another level's own oracle demonstrations.
# usage: run_beyond.sh NAME TASKS LEVEL SEED   (e.g. run_beyond.sh l2_s0 terminal 2 0; run_beyond.sh bfcl_s0 bfcl 1 0)
# One home per run under $RUNS; the warm start's gate benchmarks the checkpoint on the level's held-out split
# (paired against the base, which is the RL-alone control: RL never leaves the base at 0%).
name=$1; tasks=$2; level=$3; seed=$4
home=${RUNS:-/tmp/tentalis-runs}/$name
mkdir -p "$home"
export TENTALIS_HOME=$home OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
cd "$(dirname "$0")/../.."
{
echo "start $(date +%s) $(date) commit $(git rev-parse --short HEAD)"
.venv/bin/tentalis init
.venv/bin/tentalis warmstart --tasks "$tasks" --levels "$level" --num-tasks ${WS_TASKS:-96} --epochs ${WS_EPOCHS:-4} \
    --learning-rate ${WS_LR:-5e-4} --seed 0 --run-seed "$seed"
echo "end $(date +%s) $(date)"
} > "$home.log" 2>&1
