#!/bin/bash
# Round 20's second arm, declared after seeds 0-1 of the first: manager D's hints with the manager's score out of the
# worker's reward ('{"manager": 0}', as round 19's verifiernoscore), so hints and scores are told apart. Each job one
# worker run of 4 cycles in $RUNS/mgr20-noscore-sS (D registered from mgr20-exp, no hint prefix) and its last checkpoint
# on the 512 held-out items, linked as $RUNS/wide/mgr18-proposednoscore-sS. Waits for round20.sh's queue to end.
# Usage: MANAGER=m-… experiments/manager_rl/round20b.sh 0 1 2 3   (logs in $LOGS, default /work/logs)
set -euo pipefail
source "$(dirname "$0")/env.sh"
R=$CODE/experiments/manager_rl
LOGS=${LOGS:-/work/logs}
cd "$CODE"
while pgrep -f "round20.sh jobs" >/dev/null; do sleep 20; done
job() {
  local s=$1 H=$RUNS/mgr20-noscore-s$1
  rm -rf "$H"; TENTALIS_HOME=$H $T init >/dev/null
  $PY -m experiments.manager_rl.register --source "$RUNS/mgr20-exp" --target "$H" --checkpoint "$MANAGER"
  TENTALIS_HOME=$H $T learn --cycles 4 --method guide --manager llm --hint-prefix "" --seed "$s" --reward-weights '{"manager": 0}'
  RUNS=$RUNS "$R/wide_heldout.sh" "mgr20-noscore-s$s"
  ln -sfn "$RUNS/wide/mgr20-noscore-s$s" "$RUNS/wide/mgr18-proposednoscore-s$s"
}
running=0
for s in "$@"; do
  if [ "$running" -ge "${SLOTS:-2}" ]; then wait -n || true; running=$((running - 1)); fi
  job "$s" > "$LOGS/r20-proposednoscore-s$s.log" 2>&1 &
  running=$((running + 1))
done
wait
