#!/bin/bash
# Round 15: round 14's manager with its score taught back, hints untouched. A copy of round 14's home ($RUNS/$FROM-exp)
# as $RUNS/$PREFIX-exp, round 14's manager $PARENT promoted, a trained worker registered so the harvest has accepted
# answers (round 14's update saw only 15: the base worker solves ~6% of level-1 tasks), $HARVESTS harvests of 64 level-1
# tasks x 4 samples, then $UPDATES chained best-of-n updates whose only demonstrations are the verifier's scores (round
# 8b/8c: two such updates made the scores separate): --best-min-value $BAR (1000: no hint clears it, so no hint is
# trained), 32 failures and 32 accepted answers an update. Prints the new manager checkpoint.
# Settings: FROM (mgr14), PREFIX (mgr15), PARENT (m-d6ed014e733e), WORKER_HOME (mgr14-trained-s0), HARVESTS (3),
# UPDATES (2), BAR (1000), FIRST_SEED (11: the first harvest's seed), CONTINUE=1 (keep the home and its serving manager:
# harvest and update on top of PARENT, promoted first: a chain's last update is not promoted, e.g. CONTINUE=1
# PARENT=m-725aca102271 FIRST_SEED=14 HARVESTS=1 UPDATES=1 for a third update)
set -euo pipefail
source "$(dirname "$0")/env.sh"
export TENTALIS_HOME=$RUNS/${PREFIX:-mgr15}-exp
cd "$CODE"
if [ -z "${CONTINUE:-}" ]; then
  rm -rf "$TENTALIS_HOME"; cp -a "$RUNS/${FROM:-mgr14}-exp" "$TENTALIS_HOME"
  $T promote "${PARENT:-m-d6ed014e733e}" --role manager --reason "round 15: the score updates start from round 14's manager"
  $PY -m experiments.manager_rl.register --role worker --source "$RUNS/${WORKER_HOME:-mgr14-trained-s0}" --target "$TENTALIS_HOME"
else
  $T promote "$PARENT" --role manager --reason "round 15: a further score update on top of $PARENT"
fi
F=${FIRST_SEED:-11}
for s in $(seq "$F" $((F + ${HARVESTS:-3} - 1))); do
  $T run --no-train --num-tasks 64 --num-generations 4 --levels 1 --max-new-tokens 96 --seed "$s"
done
$T manager train --updates "${UPDATES:-2}" --failures 32 --num-generations 2 --rescue-samples 4 --learning-rate 2e-4 \
  --reward dense --success-share 1.0 --accepted-per-task 4 --score-targets verifier --hint-prefix "First compute" \
  --manager-temperature 0.8 --seed 3 --update best_of_n --best-min-value "${BAR:-1000}" --num-iterations 4 --per-step-rows 8
$PY -m experiments.manager_rl.newest "$TENTALIS_HOME" --role manager
