#!/bin/bash
# Round 22: manager E's hints with a score adapter of its own (`--part score`, round 17's split), so the score separates
# where E's writes 0 for every rollout; then round 19's worker test.
#   manager     home $RUNS/mgr22-exp, a copy of round 20's mgr20-exp (D and E, both harvests): E promoted, a trained
#               worker registered so the harvests have accepted answers ($WORKER_HOME's served worker: the base worker
#               solves ~6% of level-1 tasks), harvests of seeds 11-12, then round 17 C's score update (a fresh score
#               adapter, ratio 1 every step, lr 5e-4, 2 passes of 8 rows a step, as many failures as accepted answers,
#               at most 142). E's review adapter is kept tensor for tensor. Prints the new manager checkpoint.
#               Settings: HOME_NAME (mgr22: the home $RUNS/$HOME_NAME-exp; a score update takes only pairs no update of
#               the home took, so a retry needs its own home), PASSES (2: --num-iterations), SCORE_LR (5e-4)
#   gate        in $RUNS/$HOME_NAME-exp (E serving): E and the score adapter MANAGER evaluated (8 worker samples a hint),
#               then `manager gate MANAGER`, and again at --min-accepted 0 when it refuses to decide for want of accepted
#               answers (the candidate's hint check of round 22)
#   scored:S    a worker run with that manager (`run.sh worker trained S`, 4 cycles, no hint prefix, homes
#               $RUNS/$HOME_NAME-trained-sS) and its last checkpoint on the 512 held-out items, linked as
#               $RUNS/wide/mgr18-scored-sS
# Usage: [HOME_NAME=…] round22.sh manager | HOME_NAME=… MANAGER=<E_s> round22.sh gate | jobs scored:0 scored:1 ...   (at most $SLOTS (2) jobs at a time,
# one thread each; logs in $LOGS, default /work/logs)
set -euo pipefail
source "$(dirname "$0")/env.sh"
R=$CODE/experiments/manager_rl
LOGS=${LOGS:-/work/logs}
E=${E:-m-34e43b188fbf}  # round 21's manager E (a rebuild sets its own id)
case $1 in
  manager)
    export TENTALIS_HOME=$RUNS/${HOME_NAME:-mgr22}-exp
    cd "$CODE"
    if [ ! -d "$TENTALIS_HOME" ]; then
      cp -a "$RUNS/mgr20-exp" "$TENTALIS_HOME.tmp" && mv "$TENTALIS_HOME.tmp" "$TENTALIS_HOME"
      $T promote "$E" --role manager --reason "round 22: the score adapter is trained beside E's review adapter"
      $PY -m experiments.manager_rl.register --role worker --source "$RUNS/${WORKER_HOME:-mgr18-base-s0}" --target "$TENTALIS_HOME"
      for s in 11 12; do $T run --no-train --num-tasks 64 --num-generations 4 --levels 1 --max-new-tokens 96 --seed "$s"; done
    fi
    $T manager train --part score --failures "${SCORE_FAILURES:-142}" --accepted-per-task 4 --learning-rate "${SCORE_LR:-5e-4}" \
      --num-iterations "${PASSES:-2}" --per-step-rows 8 --seed 3
    $PY -m experiments.manager_rl.newest "$TENTALIS_HOME" --role manager ;;
  gate)
    export TENTALIS_HOME=$RUNS/${HOME_NAME:-mgr22}-exp OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
    cd "$CODE"
    $T manager evaluate --checkpoint "$E" --eval-rescue-samples 8
    $T manager evaluate --checkpoint "$MANAGER" --eval-rescue-samples 8
    $T manager gate "$MANAGER" || $T manager gate "$MANAGER" --min-accepted 0 ;;
  jobs)
    shift
    : "${MANAGER:?MANAGER: the checkpoint id of E with its score adapter, in \$RUNS/\$HOME_NAME-exp}"
    job() {
      local s=$1
      local p=${HOME_NAME:-mgr22}  # run.sh registers MANAGER from $RUNS/$p-exp, the home it was trained in
      PREFIX=$p HINT_PREFIX="" CYCLES=4 "$R/run.sh" worker trained "$s"
      RUNS=$RUNS "$R/wide_heldout.sh" "$p-trained-s$s"
      ln -sfn "$RUNS/wide/$p-trained-s$s" "$RUNS/wide/mgr18-scored-s$s"
    }
    run_jobs r22 "$@" ;;
  *) echo "usage: round22.sh manager | HOME_NAME=… MANAGER=<E_s> round22.sh gate | jobs scored:S ..." >&2; exit 2 ;;
esac
