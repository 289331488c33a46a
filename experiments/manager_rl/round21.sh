#!/bin/bash
# Round 21: manager E, round 20's D with its second update (`round20.sh second`: harvest seed 2, D served and sampled,
# the verifier's proposals again, bar 0.881), judged by round 19's test.
#   gate        in $RUNS/mgr20-exp (D serving, both harvests' held-out side): the untrained manager ("First compute"), D
#               and E evaluated (8 worker samples a hint), then `manager gate E` against D, and again at --min-accepted 0
#   second:S    a worker run with E (`run.sh worker trained S`, 4 cycles, no hint prefix, homes $RUNS/mgr21-trained-sS)
#               and its last checkpoint on the 512 held-out items, linked as $RUNS/wide/mgr18-second-sS
# Usage: MANAGER=<E> experiments/manager_rl/round21.sh gate | jobs second:0 second:1 ...   (at most $SLOTS (2) jobs at a time,
# one thread each; logs in $LOGS, default /work/logs)
set -euo pipefail
source "$(dirname "$0")/env.sh"
R=$CODE/experiments/manager_rl
LOGS=${LOGS:-/work/logs}
: "${MANAGER:?MANAGER: the checkpoint id of manager E in \$RUNS/mgr20-exp}"
case $1 in
  gate)
    export TENTALIS_HOME=$RUNS/mgr20-exp OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
    cd "$CODE"
    $T manager evaluate --checkpoint base --eval-rescue-samples 8 --hint-prefix "First compute"
    $T manager evaluate --checkpoint m-08c218c956b3 --eval-rescue-samples 8
    $T manager evaluate --checkpoint "$MANAGER" --eval-rescue-samples 8
    $T manager gate "$MANAGER" || true
    $T manager gate "$MANAGER" --min-accepted 0 ;;
  jobs)
    shift
    # run.sh registers the manager from $RUNS/$PREFIX-exp: E lives in round 20's home
    [ -e "$RUNS/mgr21-exp" ] || ln -s "$RUNS/mgr20-exp" "$RUNS/mgr21-exp"
    job() {
      local s=$1
      PREFIX=mgr21 HINT_PREFIX="" CYCLES=4 "$R/run.sh" worker trained "$s"
      RUNS=$RUNS "$R/wide_heldout.sh" "mgr21-trained-s$s"
      ln -sfn "$RUNS/wide/mgr21-trained-s$s" "$RUNS/wide/mgr18-second-s$s"
    }
    run_jobs r21 "$@" ;;
  *) echo "usage: MANAGER=<E> round21.sh jobs second:S ..." >&2; exit 2 ;;
esac
