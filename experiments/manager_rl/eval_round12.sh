#!/bin/bash
# Round 12's measurements once an arm's homes ($RUNS/$PREFIX-base-sS, $RUNS/$PREFIX-cotrain-sS) have finished.
#   eval_round12.sh homes ARM SEED...  : 8 samples an item at cycle $CYCLE (sampled_$PREFIX.jsonl) and the transfer set on
#                                        each home's last checkpoint (transfer_$PREFIX.jsonl), one process at a time (nice 19:
#                                        the other arm may still be learning)
#   eval_round12.sh report SEED...     : the greedy worker paired by item ($PREFIX.csv/.png), where guidance went, the scores
#                                        on the worker's own rollouts, and the sampled and transfer comparisons (eval_$PREFIX.txt)
# Settings: PREFIX (mgr12), CYCLE (4: the arms' last cycle)
set -euo pipefail
RUNS=${RUNS:-/work/runs}
P=${PREFIX:-mgr12}
K=${CYCLE:-4}
CODE=${CODE:-$(cd "$(dirname "$0")/../.." && pwd)}
PY=${PY:-/work/main/.venv/bin/python}
export PYTHONPATH=$CODE TENTALIS_DATA_DIR=${TENTALIS_DATA_DIR:-/work/shared/data} MKL_NUM_THREADS=1 OMP_NUM_THREADS=1 RUNS
unset DAGSTER_HOME
cd "$CODE"
D=experiments/manager_rl
case "$1" in
  homes)
    ARM=$2; shift 2
    for S in "$@"; do
      nice -n 19 $PY -m experiments.manager_rl.sampled_eval run --home "$RUNS/$P-$ARM-s$S" --cycles "$K" --out "$D/sampled_$P.jsonl"
      nice -n 19 bash $D/transfer_last.sh "$P-$ARM-s$S" | tee -a "$D/transfer_$P.jsonl"
    done ;;
  report)
    shift
    SEEDS=$(IFS=,; echo "$*")
    {
      echo "== greedy held-out, paired by item"
      $PY -m experiments.manager_rl.round2_workers --prefix "$P" --arm cotrain --against base --seeds "$SEEDS" --per-seed --runs-level --csv "$D/$P.csv"
      echo "== where guidance went"
      $PY -m experiments.manager_rl.guided --seeds "$SEEDS" --by-cycle "$P-base" "$P-cotrain"
      echo "== scores on the worker's own rollouts, cycles 2-$K and cycle $K"
      $PY -m experiments.manager_rl.scores --seeds "$SEEDS" --cycles "$(seq -s, 2 "$K")" --against "$P-base" "$P-base" "$P-cotrain"
      $PY -m experiments.manager_rl.scores --seeds "$SEEDS" --cycles "$K" --against "$P-base" "$P-base" "$P-cotrain"
      echo "== sampled, cycle $K"
      $PY -m experiments.manager_rl.sampled_eval compare --file "$D/sampled_$P.jsonl" --cycle "$K" --seeds "$SEEDS" "$P-base" "$P-cotrain"
      echo "== transfer, each home's last checkpoint"
      $PY -m experiments.manager_rl.transfer_pairs --seeds "$SEEDS" "$P-base" "$P-cotrain"
    } 2>&1 | tee "$D/eval_$P.txt" ;;
  *) echo "usage: eval_round12.sh homes ARM SEED... | report SEED..." >&2; exit 2 ;;
esac
