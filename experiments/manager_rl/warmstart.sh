#!/bin/bash
# Round 13: round 6's first update rebuilt on this host, as the co-trained arm's starting manager. In one home
# ($RUNS/$PREFIX-exp): harvest the base worker's rollouts (`tentalis run --no-train`, level-1 tasks, 4 samples a task),
# then one best-of-n update of the untrained manager on $FAILURES of their failures at bar 0.5 (a positive dense gain:
# round 6 found 40 hint demonstrations on 48 failures this way, the in-loop first update of round 12 5-6 on 16), its
# scores taught by the verifier's (round 9). Prints the new manager checkpoint; `cotrain.sh` then starts from it
# (SOURCE=$RUNS/$PREFIX-exp MANAGER=<it>).
# Settings: PREFIX (mgr13), HARVESTS (harvest runs of 64 tasks, 1), FAILURES (48), BAR (0.5), SKIP_HARVEST=1 (the home's
# harvest is kept: the update alone)
set -euo pipefail
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
source "$(dirname "$0")/env.sh"
export TENTALIS_HOME=$RUNS/${PREFIX:-mgr13}-exp
cd "$CODE"
if [ -z "${SKIP_HARVEST:-}" ]; then
  rm -rf "$TENTALIS_HOME"; $T init >/dev/null
  for s in $(seq 1 "${HARVESTS:-1}"); do
    $T run --no-train --num-tasks 64 --num-generations 4 --levels 1 --max-new-tokens 96 --seed "$s"
  done
fi
$T manager train --updates 1 --failures "${FAILURES:-48}" --num-generations 6 --rescue-samples 4 --learning-rate 2e-4 \
  --reward dense --success-share 1.0 --accepted-per-task 4 --score-targets verifier --hint-prefix "First compute" \
  --manager-temperature 0.8 --seed 1 --update best_of_n --best-min-value "${BAR:-0.5}" --num-iterations 4 --per-step-rows 8
$PY -m experiments.manager_rl.newest "$TENTALIS_HOME" --role manager
