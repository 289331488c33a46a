#!/bin/bash
# Round 18b: a score update again on the same data with other settings. A copy of $RUNS/$FROM-exp as $RUNS/$PREFIX-exp
# without the score checkpoint $DROP (so its rollouts count as fresh again: a home's score updates never reuse one), the
# hint manager $PARENT served, then `tentalis manager train --part score` with $ITERATIONS passes at $LR. Prints the new
# manager checkpoint. Settings: FROM (mgr18), PREFIX (mgr18b), DROP, PARENT, ITERATIONS (4), LR (5e-4)
set -euo pipefail
source "$(dirname "$0")/env.sh"
export TENTALIS_HOME=$RUNS/${PREFIX:-mgr18b}-exp
cd "$CODE"
rm -rf "$TENTALIS_HOME"; cp -a "$RUNS/${FROM:-mgr18}-exp" "$TENTALIS_HOME"
$PY -c "
import sys
from tentalis_pipelines.lakehouse import Lakehouse
n = Lakehouse(sys.argv[1] + '/lakehouse').delete('manager_checkpoints', f\"checkpoint_id = '{sys.argv[2]}'\")
print(f'dropped {n} row(s) of {sys.argv[2]}')" "$TENTALIS_HOME" "$DROP"
$T promote "$PARENT" --role manager --reason "round 18b: the score update again from the hint manager"
$T manager train --part score --failures 142 --accepted-per-task 4 --learning-rate "${LR:-5e-4}" \
  --num-iterations "${ITERATIONS:-4}" --per-step-rows 8 --seed 3
$PY -m experiments.manager_rl.newest "$TENTALIS_HOME" --role manager
