#!/bin/bash
# Round 7: the manager learns on the failures of the worker it serves. One worker home per seed; the manager
# it starts from is registered from $SOURCE (default: the gated m-7884511cb361 of $RUNS/mgr6b-exp). Each cycle:
# one guided learning cycle (`tentalis learn --cycles 1`, the same task order as `--cycles N`), then one
# best_of_n update of the serving manager on that cycle's fresh failures under the worker that now serves,
# promoted to review the next cycle (a lab decision: no held-out gate fits 8 tasks a cycle; the update is
# refused, and the manager kept, when no hint clears the bar).
# Usage: cotrain.sh SEED   (homes $RUNS/$PREFIX-cotrain-sSEED; settings: CYCLES, FAILURES, BAR, ITERATIONS, MANAGER,
# SHARE (accepted answers per failure, 0.5), PER_TASK (accepted answers per task, 1), TARGETS (score targets, sampled),
# GUIDE_FORMAT (the worker's --guide-answer-format, round 10: tagged); SOURCE=base starts from the untrained manager (round 11);
# FIRST_BAR (the first update's --best-min-value, default BAR; round 12: 0.5, as round 6's first update, then BAR))
set -euo pipefail
SEED=$1
RUNS=${RUNS:-/work/runs}
CODE=${CODE:-$(cd "$(dirname "$0")/../.." && pwd)}
PY=${PY:-/work/main/.venv/bin/python}
export PYTHONPATH=$CODE TENTALIS_DATA_DIR=${TENTALIS_DATA_DIR:-/work/shared/data} MKL_NUM_THREADS=1 OMP_NUM_THREADS=1
unset DAGSTER_HOME
T="$PY -m tentalis_pipelines.cli"
H=$RUNS/${PREFIX:-mgr7}-cotrain-s$SEED
export TENTALIS_HOME=$H
cd "$CODE"
rm -rf "$H"; $T init >/dev/null
if [ "${SOURCE:-}" != base ]; then
  $PY -m experiments.manager_rl.register --source ${SOURCE:-$RUNS/mgr6b-exp} --target "$H" --checkpoint ${MANAGER:-m-7884511cb361}
fi
newest() { $PY -m experiments.manager_rl.newest "$H" --role manager; }
CYCLES=${CYCLES:-4}
for k in $(seq 1 "$CYCLES"); do
  $T learn --cycles 1 --method guide --manager llm --seed "$SEED" --hint-prefix "First compute" ${GUIDE_FORMAT:+--guide-answer-format $GUIDE_FORMAT}
  [ "$k" -lt "$CYCLES" ] || break
  BEFORE=$(newest)
  # an untrained manager rarely writes a hint that clears 2 nats (round 11: 0 demonstrations in its first update);
  # FIRST_BAR lowers the first update's bar only
  if [ "$k" -eq 1 ]; then BAR_K=${FIRST_BAR:-${BAR:-0.881}}; else BAR_K=${BAR:-0.881}; fi
  # an update holds the manager, the worker and the trainer (up to 9 GB): several seeds at once on 24 GB wait their turn,
  # one update at a time (round 11: two that passed the free-memory check together were OOM-killed, one of them)
  while [ "$(awk '/MemAvailable/ {print int($2 / 1048576)}' /proc/meminfo)" -lt "${MIN_FREE_GB:-8}" ]; do sleep 30; done
  if flock "$RUNS/.manager-update.lock" $T manager train --updates 1 --failures ${FAILURES:-16} --num-generations 6 --rescue-samples 4 --learning-rate 2e-4 \
       --reward dense --success-share ${SHARE:-0.5} --accepted-per-task ${PER_TASK:-1} --score-targets ${TARGETS:-sampled} --hint-prefix "First compute" --manager-temperature 0.8 --seed "$k" \
       --update best_of_n --best-min-value $BAR_K --num-iterations ${ITERATIONS:-4} --per-step-rows 8; then
    AFTER=$(newest)
    [ "$AFTER" = "$BEFORE" ] || $T promote "$AFTER" --role manager --reason "round 7: trained on cycle $k's failures of the worker it serves"
  else
    rc=$?
    # a signal (128 + n: the OOM killer's 137) is a crash, not the update's refusal: the arm would go on unreviewed
    if [ "$rc" -ge 128 ]; then echo "cycle $k: manager update killed (exit $rc); the run stops" >&2; exit "$rc"; fi
    echo "cycle $k: manager update refused; the manager is kept"
  fi
done
$T manager status || true
