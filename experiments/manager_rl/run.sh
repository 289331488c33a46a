#!/bin/bash
# The manager that learns (issue 32, must-hold 3): train the llm manager by GRPO on failures of the base
# worker, gate it against the untrained one, then guided learning with each manager's hints.
#   phase manager  : harvest failures (3 x 64 level-1 tasks x 4 samples), evaluate base, train, evaluate, gate
#   phase worker   : tentalis learn --method guide --manager llm, seeds 0 and 1, untrained vs trained manager
# Usage: run.sh manager | run.sh worker ARM SEED   (ARM = base | trained | noscore | verifier). Homes under $RUNS (default /work/runs).
# Settings: PREFIX (homes $RUNS/$PREFIX-*, default mgr), UPDATES, REWARD (rescue | dense), SHARE (accepted rollouts per
# failure), GENERATIONS (reviews per failure), MANAGER_TEMPERATURE (its sampling temperature in training), SKIP_BASE=1 (the home's untrained manager is already evaluated), MANAGER, CYCLES, GUIDE_FORMAT (round 10: tagged), HINT_PREFIX (review.hint_prefix,
# the same in the manager's training, its evaluation and the worker's runs).
# GATE_LIMIT: held-out items per evaluation in the worker's runs (default 64; round 18: 512 separates item noise from
# the run-to-run spread).
set -euo pipefail
RUNS=${RUNS:-/work/runs}
CODE=${CODE:-$(cd "$(dirname "$0")/../.." && pwd)}
PY=${PY:-/work/main/.venv/bin/python}
export PYTHONPATH=$CODE TENTALIS_DATA_DIR=${TENTALIS_DATA_DIR:-/work/shared/data} MKL_NUM_THREADS=1
unset DAGSTER_HOME
T="$PY -m tentalis_pipelines.cli"
cd "$CODE"
case "$1" in
  harvest)
    export TENTALIS_HOME=$RUNS/${PREFIX:-mgr}-exp OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
    $T init >/dev/null
    for s in 1 2 3; do $T run --no-train --num-tasks 64 --num-generations 4 --levels 1 --max-new-tokens 96 --seed $s; done ;;
  manager)
    export TENTALIS_HOME=$RUNS/${PREFIX:-mgr}-exp OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
    [ -n "${SKIP_BASE:-}" ] || $T manager evaluate --checkpoint base --eval-rescue-samples 8 --hint-prefix "${HINT_PREFIX:-}"
    $T manager train --updates ${UPDATES:-4} --failures 32 --num-generations ${GENERATIONS:-4} --rescue-samples 4 --learning-rate 2e-4 \
      --reward ${REWARD:-rescue} --success-share ${SHARE:-0.25} --hint-prefix "${HINT_PREFIX:-}" \
      --manager-temperature ${MANAGER_TEMPERATURE:-1.0}
    LAST=$($PY -m experiments.manager_rl.newest "$TENTALIS_HOME" --role manager)
    # the chain promoted its own updates to sample from them: the gate compares the last with the untrained one
    $T rollback --role manager --to base --reason "gate the chain's last update against the untrained manager"
    $T manager evaluate --checkpoint $LAST --eval-rescue-samples 8 --hint-prefix "${HINT_PREFIX:-}"
    $T manager gate $LAST
    $T manager status ;;
  worker)
    ARM=$2; SEED=$3; H=$RUNS/${PREFIX:-mgr}-$ARM-s$SEED
    export TENTALIS_HOME=$H OMP_NUM_THREADS=1
    rm -rf $H; $T init >/dev/null
    if [ "$ARM" = trained ]; then $PY -m experiments.manager_rl.register --source $RUNS/${PREFIX:-mgr}-exp --target $H ${MANAGER:+--checkpoint $MANAGER}; fi
    # noscore: the untrained manager's hints, its scores out of the worker's reward (round 3's control)
    if [ "$ARM" = noscore ]; then W='{"manager": 0}'; else W='{}'; fi
    # verifier: the rule-based manager (exact scores, the task's expression or the first wrong step as the hint), the
    # best manager this task can have (round 19's ceiling); the hint prefix is the llm manager's only
    if [ "$ARM" = verifier ]; then WHO=(--manager verifier); else WHO=(--manager llm --hint-prefix "${HINT_PREFIX:-}"); fi
    $T learn --cycles ${CYCLES:-6} --method guide "${WHO[@]}" --seed $SEED --reward-weights "$W" \
      ${GUIDE_FORMAT:+--guide-answer-format $GUIDE_FORMAT} ${GATE_LIMIT:+--gate-limit $GATE_LIMIT} ;;
  *) echo "usage: run.sh harvest | manager | worker base|trained|noscore|verifier SEED" >&2; exit 2 ;;
esac
