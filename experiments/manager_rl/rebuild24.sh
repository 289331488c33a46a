#!/bin/bash
# Round 24 rebuilt (31st session): a new machine had none of the homes, so round 24's candidate is rebuilt by its
# recipe at this commit and qualified again by round 24's rules, in one chain (one thread; the untrained arm's queue
# runs beside it in the other slot):
#   1. D then E in $RUNS/mgr20-exp (`round20.sh manager`, `round20.sh second`: harvests 1 and 2, two best-of-n updates
#      with the verifier's proposals)
#   2. waits until the untrained arm's seed 0 ($WORKER_HOME, mgr24-base-s0) has its 512-item evaluation: round 22's
#      recipe registers it as the trained worker whose harvests give the score update accepted answers (round 22 used
#      round 18's mgr18-base-s0, the same command under the old cap)
#   3. the 16-pass score adapter beside E (`HOME_NAME=mgr23b PASSES=16 round22.sh manager`, E's rebuilt id)
#   4. the score pass on that home's held-out rollouts (the untrained manager, E, the candidate), then `round22.sh gate`
# Prints E's and the candidate's ids. Logs: the caller's redirect.
set -euo pipefail
source "$(dirname "$0")/env.sh"
R=$CODE/experiments/manager_rl
LOGS=${LOGS:-/work/logs}
export OMP_NUM_THREADS=1 WORKER_HOME=${WORKER_HOME:-mgr24-base-s0}
NEWEST="$PY -m experiments.manager_rl.newest"
"$R/round20.sh" manager
"$R/round20.sh" second
E=$($NEWEST "$RUNS/mgr20-exp" --role manager); echo "E rebuilt: $E"
until grep -qs '"n": 512' "$LOGS/r24-base-s${WORKER_HOME##*-s}.log"; do sleep 30; done
E=$E HOME_NAME=mgr23b PASSES=16 "$R/round22.sh" manager
CAND=$($NEWEST "$RUNS/mgr23b-exp" --role manager); echo "candidate rebuilt: $CAND"
cd "$CODE"
$PY -m experiments.manager_rl.score_pass --home "$RUNS/mgr23b-exp" base "$E" "$CAND"
E=$E HOME_NAME=mgr23b MANAGER=$CAND "$R/round22.sh" gate
echo "E $E candidate $CAND"
