#!/bin/bash
# Round 24: round 23's best score adapter beside E against the untrained manager, both under the product's new cap
# (`bound_by_ground_truth` since round 24's fix: a wrong reply with no answer in the <answer> tags at most 0.2, where a
# wrong number outside them had the tagged wrong answer's 0.5), so the score cannot pay a worker to drop its tags
# whatever the adapter reads. Each job is one worker run of 4 cycles and its last checkpoint on the 512 held-out items:
#   base:S      the untrained llm manager with round 19's settings (`run.sh worker base S`, hint prefix "First compute"),
#               home $RUNS/mgr24-base-sS: round 19's untrained arm again, under the new cap
#   scored:S    E with round 23's 16-pass score adapter m-81fc2b8eaf82 (`run.sh worker trained S`, no hint prefix),
#               registered from its home $RUNS/mgr23b-exp (linked as $RUNS/mgr24-exp), home $RUNS/mgr24-trained-sS
# Usage: experiments/manager_rl/round24.sh base:0 scored:0 base:1 scored:1 ...   (at most $SLOTS (2) jobs at a time,
# one thread each; logs in $LOGS, default /work/logs, as r24-ARM-sS.log)
set -euo pipefail
source "$(dirname "$0")/env.sh"
R=$CODE/experiments/manager_rl
MANAGER=${MANAGER:-m-81fc2b8eaf82}  # a rebuild (rebuild24.sh) sets its own id and home
[ -e "$RUNS/mgr24-exp" ] || ln -sfn "$RUNS/${CANDIDATE_HOME:-mgr23b}-exp" "$RUNS/mgr24-exp"
job() {
  local s=$1 arm=$ARM
  case $arm in
    base) PREFIX=mgr24 HINT_PREFIX="First compute" CYCLES=4 "$R/run.sh" worker base "$s" ;;
    trained) PREFIX=mgr24 HINT_PREFIX="" CYCLES=4 MANAGER=$MANAGER "$R/run.sh" worker trained "$s" ;;
  esac
  RUNS=$RUNS "$R/wide_heldout.sh" "mgr24-$arm-s$s"
}
# run_jobs passes only the seed to `job`; the arm rides in ARM, set per argument below
running=0
for x in "$@"; do
  case ${x%%:*} in base) ARM=base ;; scored) ARM=trained ;; *) echo "unknown arm in $x (base | scored)" >&2; exit 2 ;; esac
  if [ "$running" -ge "${SLOTS:-2}" ]; then wait -n || true; running=$((running - 1)); fi
  job "${x##*:}" > "${LOGS:-/work/logs}/r24-${x%%:*}-s${x##*:}.log" 2>&1 &
  running=$((running + 1))
done
wait
