#!/bin/bash
# round 7: a co-trained manager (seed $1's last, $2) on round 6's held-out set (the base worker's failures), gated against the untrained one
set -u
S=$1; M=$2; H=/work/runs/mgr7-eval-s$S
rm -rf $H; cp -r /work/runs/mgr6b-exp $H
cd "$(dirname "$0")/../.."
export PYTHONPATH=$PWD TENTALIS_DATA_DIR=/work/shared/data MKL_NUM_THREADS=1 OMP_NUM_THREADS=1 TENTALIS_HOME=$H
unset DAGSTER_HOME
T="/work/main/.venv/bin/python -m tentalis_pipelines.cli"
$T rollback --role manager --to base --reason "round 7: evaluate a co-trained manager against the untrained one"
/work/main/.venv/bin/python -m experiments.manager_rl.register --source /work/runs/mgr7-cotrain-s$S --target $H --checkpoint $M
$T manager evaluate --checkpoint $M --eval-rescue-samples 8 --hint-prefix "First compute"
$T manager gate $M
