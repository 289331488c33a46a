#!/bin/bash
# round 7b: one best_of_n update of seed 0's last co-trained manager with as many accepted answers as failures (success share 1.0),
# on its worker's fresh rollouts (cycle 4's failures, every cycle's unused accepted answers); then round 6's held-out set
set -u
H=/work/runs/mgr7r-s0; rm -rf $H; cp -r /work/runs/mgr7-cotrain-s0 $H
cd "$(dirname "$0")/../.."
export PYTHONPATH=$PWD TENTALIS_DATA_DIR=/work/shared/data MKL_NUM_THREADS=1 OMP_NUM_THREADS=2 TENTALIS_HOME=$H
unset DAGSTER_HOME
T="/work/main/.venv/bin/python -m tentalis_pipelines.cli"
$T manager train --updates 1 --failures 16 --num-generations 6 --rescue-samples 4 --learning-rate 2e-4 \
  --reward dense --success-share 1.0 --hint-prefix "First compute" --manager-temperature 0.8 --seed 4 \
  --update best_of_n --best-min-value 0.881 --num-iterations 4 --per-step-rows 8
M=$(/work/main/.venv/bin/python -m experiments.manager_rl.newest "$H" --role manager)
echo M=$M
E=/work/runs/mgr7r-eval-s0; rm -rf $E; cp -r /work/runs/mgr6b-exp $E
export TENTALIS_HOME=$E
$T rollback --role manager --to base --reason "round 7b: evaluate the score-repaired manager against the untrained one"
/work/main/.venv/bin/python -m experiments.manager_rl.register --source $H --target $E --checkpoint $M
$T manager evaluate --checkpoint $M --eval-rescue-samples 8 --hint-prefix "First compute"
$T manager gate $M
