#!/bin/bash
# Round 23: manager E's hints with a score adapter balanced within each form of answer (the product's score update
# since 2dd7ec4: as many failures as accepted answers among tagged answers and among untagged ones), so the form no
# longer stands for the class; then round 19's worker test.
#   manager     `HOME_NAME=mgr23 PASSES=8 round22.sh manager` (round 22's recipe, home $RUNS/mgr23-exp, a copy of
#               round 20's mgr20-exp: E promoted, round 18's trained worker registered, harvests of seeds 11-12, then
#               the score update at 8 passes); the same recipe, run again by this script for a retry in another home
#   gate        `HOME_NAME=mgr23 MANAGER=<candidate> round22.sh gate` (E and the candidate evaluated, 8 worker samples a
#               hint, `manager gate`), then forms: the scores of each manager on the held-out side by form of answer
#   scored:S    a worker run with that manager (`run.sh worker trained S`, 4 cycles, no hint prefix, homes
#               $RUNS/$HOME_NAME-trained-sS) and its last checkpoint on the 512 held-out items, linked as
#               $RUNS/wide/mgr18-stratified-sS
# Usage: [HOME_NAME=mgr23] [PASSES=8] round23.sh manager | HOME_NAME=… MANAGER=<id> round23.sh gate |
#        HOME_NAME=… MANAGER=<id> round23.sh jobs scored:0 scored:1 ...   (at most $SLOTS (2) jobs at a time, one thread each;
#        logs in $LOGS, default /work/logs)
set -euo pipefail
source "$(dirname "$0")/env.sh"
R=$CODE/experiments/manager_rl
LOGS=${LOGS:-/work/logs}
export HOME_NAME=${HOME_NAME:-mgr23}
case $1 in
  manager) PASSES=${PASSES:-8} "$R/round22.sh" manager ;;
  gate)
    "$R/round22.sh" gate
    cd "$CODE"
    $PY -m experiments.manager_rl.forms --home "$RUNS/$HOME_NAME-exp" ;;
  jobs)
    shift
    : "${MANAGER:?MANAGER: the checkpoint id of E with its score adapter, in \$RUNS/\$HOME_NAME-exp}"
    job() {
      local s=$1
      PREFIX=$HOME_NAME HINT_PREFIX="" CYCLES=4 "$R/run.sh" worker trained "$s"
      RUNS=$RUNS "$R/wide_heldout.sh" "$HOME_NAME-trained-s$s"
      ln -sfn "$RUNS/wide/$HOME_NAME-trained-s$s" "$RUNS/wide/mgr18-stratified-s$s"
    }
    run_jobs r23 "$@" ;;
  *) echo "usage: round23.sh manager | HOME_NAME=… MANAGER=<id> round23.sh gate | jobs scored:S ..." >&2; exit 2 ;;
esac
