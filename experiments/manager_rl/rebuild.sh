#!/bin/bash
# Round 18: round 17's manager C rebuilt from nothing in one session (a new machine had none of the earlier homes).
# In one home ($RUNS/$PREFIX-exp), each step the recipe of the round it rebuilds:
#   round 13 (`warmstart.sh`): harvest seed 1 of the base worker, one best-of-n update at bar 0.5 (seed 1);
#   round 14 (`secondupdate.sh`): harvest seed 2, the warm start served, one best-of-n update at bar 0.881 (seed 2);
#   round 17 C: the round-14 manager served, a trained worker registered ($WORKER_HOME's served worker: the base
#   worker solves ~6% of level-1 tasks, too few accepted answers to balance), $HARVESTS harvests from seed 11, then a
#   score update of a fresh score adapter (`--part score`, ratio 1 every step, lr 5e-4, 2 passes of 8 rows a step).
# Prints the manager checkpoints it wrote. Settings: PREFIX (mgr18), WORKER_HOME (mgr18-base-s0), HARVESTS (2),
# SCORE_FAILURES (as many failures as accepted answers are found, at most this: 142, round 17's), FROM_STEP (1; 3 skips
# the hint updates: the home's newest manager is the round-14 rebuild).
set -euo pipefail
source "$(dirname "$0")/env.sh"
export TENTALIS_HOME=$RUNS/${PREFIX:-mgr18}-exp
NEWEST="$PY -m experiments.manager_rl.newest $TENTALIS_HOME --role manager"
cd "$CODE"
HARVEST="--no-train --num-tasks 64 --num-generations 4 --levels 1 --max-new-tokens 96"
hint_update() {  # round 13/14's best-of-n hint update; $1 seed, $2 bar
  $T manager train --updates 1 --failures 48 --num-generations 6 --rescue-samples 4 --learning-rate 2e-4 --reward dense \
    --success-share 1.0 --accepted-per-task 4 --score-targets verifier --hint-prefix "First compute" \
    --manager-temperature 0.8 --seed "$1" --update best_of_n --best-min-value "$2" --num-iterations 4 --per-step-rows 8
}
if [ "${FROM_STEP:-1}" -le 1 ]; then
  rm -rf "$TENTALIS_HOME"; $T init >/dev/null
  $T run $HARVEST --seed 1
  hint_update 1 0.5
  WARM=$($NEWEST); echo "round 13 rebuilt: $WARM"
  $T run $HARVEST --seed 2
  $T promote "$WARM" --role manager --reason "round 18: the second update samples from the warm start (round 14)"
  hint_update 2 0.881
  echo "round 14 rebuilt: $($NEWEST)"
fi
HINTS=$($NEWEST)
$T promote "$HINTS" --role manager --reason "round 18: the score update starts from the round-14 rebuild (round 17 C)"
# the trained worker: the untrained arm's seed 0 after its four cycles (its seed 1 starts when it is done)
while [ ! -d "$RUNS/${WAIT_FOR:-mgr18-base-s1}" ]; do sleep 30; done
$PY -m experiments.manager_rl.register --role worker --source "$RUNS/${WORKER_HOME:-mgr18-base-s0}" --target "$TENTALIS_HOME"
for s in $(seq 11 $((10 + ${HARVESTS:-2}))); do $T run $HARVEST --seed "$s"; done
$T manager train --part score --failures "${SCORE_FAILURES:-142}" --accepted-per-task 4 --learning-rate 5e-4 \
  --num-iterations 2 --per-step-rows 8 --seed 3
echo "round 17 C rebuilt: $($NEWEST)"
