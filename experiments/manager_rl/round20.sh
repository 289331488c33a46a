#!/bin/bash
# Round 20: a manager warm-started on the verifier's hints (`--hint-proposals verifier`), then judged by round 19's test.
#   manager       in $RUNS/mgr20-exp: harvest seed 1 of the base worker (round 13's), then round 13's best-of-n update
#                 with the verifier's hint offered beside the 6 sampled reviews of each failure (no hint prefix: the
#                 proposals are written as the verifier writes them); prints the new manager checkpoint
#   second        round 14's second update on harvest seed 2, the warm start served and sampled, proposals again, bar 0.881
#   proposed:S    a worker run with that manager (`run.sh worker trained S`, 4 cycles, no hint prefix) and its last
#                 checkpoint on the 512 held-out items, linked as $RUNS/wide/mgr18-proposed-sS beside round 19's arms
# Usage: experiments/manager_rl/round20.sh manager | second | jobs proposed:0 proposed:1 ...   (MANAGER for jobs;
# at most $SLOTS (2) jobs at a time, one thread each; logs in $LOGS, default /work/logs)
set -euo pipefail
source "$(dirname "$0")/env.sh"
R=$CODE/experiments/manager_rl
LOGS=${LOGS:-/work/logs}
HARVEST="--no-train --num-tasks 64 --num-generations 4 --levels 1 --max-new-tokens 96"
update() {  # $1 seed, $2 bar: round 13/14's update, its hint prefix traded for the verifier's proposals
  $T manager train --updates 1 --failures 48 --num-generations 6 --rescue-samples 4 --learning-rate 2e-4 --reward dense \
    --success-share 1.0 --accepted-per-task 4 --score-targets verifier --hint-prefix "" --hint-proposals verifier \
    --manager-temperature 0.8 --seed "$1" --update best_of_n --best-min-value "$2" --num-iterations 4 --per-step-rows 8
}
case $1 in
  manager|second)
    export TENTALIS_HOME=$RUNS/mgr20-exp OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
    NEWEST="$PY -m experiments.manager_rl.newest $TENTALIS_HOME --role manager"
    cd "$CODE"
    if [ "$1" = manager ]; then
      [ -d "$TENTALIS_HOME/lakehouse/rollouts" ] || { rm -rf "$TENTALIS_HOME"; $T init >/dev/null; $T run $HARVEST --seed 1; }
      update 1 0.5
    else
      $T run $HARVEST --seed 2
      $T promote "$($NEWEST)" --role manager --reason "round 20: the second update samples from the warm start"
      update 2 0.881
    fi
    $NEWEST ;;
  jobs)
    shift
    job() {
      local s=$1
      PREFIX=mgr20 HINT_PREFIX="" CYCLES=4 "$R/run.sh" worker trained "$s"
      RUNS=$RUNS "$R/wide_heldout.sh" "mgr20-trained-s$s"
      ln -sfn "$RUNS/wide/mgr20-trained-s$s" "$RUNS/wide/mgr18-proposed-s$s"
    }
    running=0
    for x in "$@"; do
      if [ "$running" -ge "${SLOTS:-2}" ]; then wait -n || true; running=$((running - 1)); fi
      job "${x##*:}" > "$LOGS/r20-${x%%:*}-s${x##*:}.log" 2>&1 &
      running=$((running + 1))
    done
    wait ;;
  *) echo "usage: round20.sh manager | second | jobs proposed:S ..." >&2; exit 2 ;;
esac
