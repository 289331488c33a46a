#!/bin/bash
# Usage: RUNS=<folder> [ROUND=2 HEAD_FROM=<home with a trained head>] experiments/prm_step_scorer/run.sh SEED
# Both arms of one seed, side by side, one thread each: the PRM head (trained once and copied so that every
# seed scores with the same head) against the calculator, in process mode. Round 1 (the layer-6 hidden-state
# head) used homes prm_sS / calculator_sS and trained its head in prm_s0; round 2 (the surprise head) uses
# prm2_sS / calculator2_sS and copies the head of HEAD_FROM; round 3 (the hidden-state head of `tentalis prm
# train`'s defaults, from HEAD_FROM) runs only its prm3_sS arm, against round 2's calculator2_sS; round 4 (the
# surprise head again, now that a model judges only completions in the step format) runs prm4_sS likewise, and
# round 5 (round 3's hidden-state head under that rule) runs prm5_sS; round 6 (round 4's head, both arms with
# step and outcome rewards only centred, `--scale-rewards none`) runs prm6_sS and calculator6_sS; round 7 (a
# hidden-state head that also learned from reviewed rollouts, round7_source.sh) runs prm7_sS; round 8 (the same,
# with the rollouts weighted, `tentalis prm train`'s new default, round8_source.sh) runs prm8_sS; round 9 (round 8's
# head retrained once right rollouts are labelled too, in a copy of round 8's source home) runs prm9_sS.
set -euo pipefail
cd "$(dirname "$0")/../.."
RUNS=${RUNS:-/work/runs}
S=$1
case "${ROUND:-1}" in
  2) P=prm2; C=calculator2; SRC=${HEAD_FROM:?the home whose reviewers/prm_head to copy} ;;
  3) P=prm3; C=; SRC=${HEAD_FROM:?the home whose reviewers/prm_head to copy} ;;
  4|5|7|8|9) P=prm${ROUND}; C=; SRC=${HEAD_FROM:?the home whose reviewers/prm_head to copy} ;;
  6) P=prm6; C=calculator6; SRC=${HEAD_FROM:?the home whose reviewers/prm_head to copy}; EXTRA="--scale-rewards none" ;;
  *) P=prm; C=calculator; SRC=$RUNS/prm_s0 ;;
esac
if [ ! -d "$SRC/reviewers/prm_head" ]; then
  TENTALIS_DATA_DIR=${TENTALIS_DATA_DIR:?} .venv/bin/tentalis prm train --home "$SRC" --train-problems 600 --no-embeddings --no-rollouts
fi
if [ "$RUNS/${P}_s$S" != "$SRC" ]; then mkdir -p "$RUNS/${P}_s$S"; rm -rf "$RUNS/${P}_s$S/reviewers"; cp -r "$SRC/reviewers" "$RUNS/${P}_s$S/"; fi
OMP_NUM_THREADS=1 .venv/bin/tentalis learn --cycles 8 --seed "$S" --advantage-mode process ${EXTRA:-} --step-scorer prm_head --home "$RUNS/${P}_s$S" > "$RUNS/learn_${P}_head_s$S.log" 2>&1 &
[ -z "$C" ] || OMP_NUM_THREADS=1 .venv/bin/tentalis learn --cycles 8 --seed "$S" --advantage-mode process ${EXTRA:-} --step-scorer calculator --home "$RUNS/${C}_s$S" > "$RUNS/learn_${C}_s$S.log" 2>&1 &
wait
