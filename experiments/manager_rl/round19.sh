#!/bin/bash
# Round 19's queue: each job one worker run of 4 cycles and its last checkpoint on the 512 held-out items
# (`wide_heldout.sh`), at most $SLOTS (2) jobs at a time, one thread each. A job is ARM:SEED:
#   base      round 18's untrained llm manager (`run.sh worker base`, hint prefix "First compute")
#   verifier  the verifier as the worker's manager (`run.sh worker verifier`): exact scores, plan hints
#   verifiernoscore  the verifier's hints with the manager's score out of the worker's reward ('{"manager": 0}'):
#             what the hints alone carry
#   eval      only the 512-item evaluation of mgr18-base-sSEED, once its running `run.sh worker base SEED` ends
# Usage: experiments/manager_rl/round19.sh verifier:5 base:6 ...   (logs in $LOGS, default /work/logs)
set -euo pipefail
source "$(dirname "$0")/env.sh"
R=$CODE/experiments/manager_rl
LOGS=${LOGS:-/work/logs}
job() {
  local arm=$1 s=$2 H
  case $arm in
    base|verifier) PREFIX=mgr18 HINT_PREFIX="First compute" CYCLES=4 "$R/run.sh" worker "$arm" "$s" ;;
    verifiernoscore)
      H=$RUNS/mgr18-$arm-s$s; rm -rf "$H"
      TENTALIS_HOME=$H $T init >/dev/null
      TENTALIS_HOME=$H $T learn --cycles 4 --method guide --manager verifier --seed "$s" --reward-weights '{"manager": 0}' ;;
    eval) arm=base; while pgrep -f "run.sh worker base $s\$" >/dev/null; do sleep 10; done ;;
    *) echo "unknown arm $arm" >&2; return 2 ;;
  esac
  RUNS=$RUNS "$R/wide_heldout.sh" "mgr18-$arm-s$s"
}
running=0
for x in "$@"; do
  if [ "$running" -ge "${SLOTS:-2}" ]; then wait -n || true; running=$((running - 1)); fi
  job "${x%%:*}" "${x##*:}" > "$LOGS/r19-${x%%:*}-s${x##*:}.log" 2>&1 &
  running=$((running + 1))
done
wait
