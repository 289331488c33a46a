#!/bin/bash
# Round 14: round 6's second update rebuilt on this host. A copy of the warm start's home ($RUNS/$FROM-exp, round 13's
# `warmstart.sh`) as $RUNS/$PREFIX-exp, its manager $PARENT promoted so the update samples from it, a fresh harvest of
# the base worker (64 level-1 tasks x 4 samples, seed $HARVEST_SEED: the first update used every training-side failure
# of seed 1's), then one best-of-n update at bar $BAR (0.881: a dense gain above 2 nats; round 6: 11 of its 17 hint
# demonstrations were plans, and the greedy hint named the expression for 9 of 39 held-out failures) with the verifier's
# score targets (round 8c: a second verifier-score update made the scores separate). Prints the new manager checkpoint.
# Settings: FROM (mgr13), PREFIX (mgr14), PARENT (m-0934c0870c90), HARVEST_SEED (2), FAILURES (48), BAR (0.881)
set -euo pipefail
source "$(dirname "$0")/env.sh"
export TENTALIS_HOME=$RUNS/${PREFIX:-mgr14}-exp
cd "$CODE"
rm -rf "$TENTALIS_HOME"; cp -a "$RUNS/${FROM:-mgr13}-exp" "$TENTALIS_HOME"
$T promote "${PARENT:-m-0934c0870c90}" --role manager --reason "round 14: the second update samples from the warm start"
$T run --no-train --num-tasks 64 --num-generations 4 --levels 1 --max-new-tokens 96 --seed "${HARVEST_SEED:-2}"
$T manager train --updates 1 --failures "${FAILURES:-48}" --num-generations 6 --rescue-samples 4 --learning-rate 2e-4 \
  --reward dense --success-share 1.0 --accepted-per-task 4 --score-targets verifier --hint-prefix "First compute" \
  --manager-temperature 0.8 --seed 2 --update best_of_n --best-min-value "${BAR:-0.881}" --num-iterations 4 --per-step-rows 8
$PY -m experiments.manager_rl.newest "$TENTALIS_HOME" --role manager
