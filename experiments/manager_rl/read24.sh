#!/bin/bash
# Round 24's reading over SEEDS (comma list, the seeds the clock rule admits): the endpoint (candidate − untrained on
# the 512 items, seeds and items drawn), the score criteria on the worker's own rollouts, and what is reported beside
# it (each seed's format rate and lenient accuracy, forms, guided samples, candidate − E and − verifier and the
# untrained arm under the new cap − under the old one, from the committed item files of rounds 19 and 21).
# Usage: SEEDS=0,1,2 experiments/manager_rl/read24.sh   (TRANSFER=1 also runs the transfer set, ~2 min a home, two at a time)
set -euo pipefail
source "$(dirname "$0")/env.sh"
R=$CODE/experiments/manager_rl
LOGS=${LOGS:-/work/logs}
: "${SEEDS:?SEEDS: the seeds the clock rule admits, e.g. 0,1,2}"
cd "$CODE"
W="$PY -m experiments.manager_rl.round2_workers --runs $RUNS/wide --seeds $SEEDS --prefix mgr24"
TMP=$(mktemp -d)
echo "== endpoint: candidate − untrained (cycle 4, 512 items)"
$W --arm trained --against base --per-seed --runs-level --csv "$R/round24.csv" --items "$R/round24_wide_items.csv"
# the committed arms, renamed so that no name is both a home of this round and a stored arm
awk -F, 'NR == 1 || $1 == "trained" {sub(/^trained/, "E"); print}' "$R/round21_wide_items.csv" > "$TMP/E.csv"
awk -F, 'NR == 1 || $1 == "base" {sub(/^base/, "base18"); print}' "$R/round19_wide_items.csv" > "$TMP/base18.csv"
echo "== candidate − E (round 21)";        $W --arm trained --against E --from-items "$TMP/E.csv" --runs-level | tail -n 1
echo "== candidate − verifier (round 19)"; $W --arm trained --against verifier --from-items "$R/round19_wide_items.csv" --runs-level | tail -n 1
echo "== untrained under the new cap − under the old (mgr24-base − mgr18-base)"
$W --arm base --against base18 --from-items "$TMP/base18.csv" --per-seed --runs-level | tail -n "$(( $(tr ',' '\n' <<< "$SEEDS" | wc -l) + 1 ))"
echo "== each seed's format rate and lenient accuracy on the 512 items (arm seed accuracy format lenient)"
for arm in base scored; do
  for s in ${SEEDS//,/ }; do
    $PY - "$LOGS/r24-$arm-s$s.log" "$arm" "$s" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{") and '"n": 512' in l]
r = rows[-1]
print(sys.argv[2], sys.argv[3], f"{r['accuracy']:.3f} {r['format_rate']:.2f} {r['lenient_accuracy']:.3f}")
EOF
  done
done
echo "== (2) the worker's own rollouts, cycles 2-4"
$PY -m experiments.manager_rl.scores --runs "$RUNS" --seeds "$SEEDS" --cycles 2,3,4 --own --against mgr24-base mgr24-base mgr24-trained
echo "== forms on the worker's own rollouts"
$PY -m experiments.manager_rl.forms --runs "$RUNS" --seeds "$SEEDS" --own mgr24-trained mgr24-base
echo "== guided samples"
$PY -m experiments.manager_rl.guided --runs "$RUNS" --seeds "$SEEDS" mgr24-base mgr24-trained
if [ -n "${TRANSFER:-}" ]; then
  homes=(); for s in ${SEEDS//,/ }; do homes+=("mgr24-base-s$s" "mgr24-trained-s$s"); done
  # two slots, one thread each: the even-numbered homes in one, the odd in the other
  even=(); odd=(); for i in "${!homes[@]}"; do if (( i % 2 )); then odd+=("${homes[$i]}"); else even+=("${homes[$i]}"); fi; done
  RUNS=$RUNS "$R/transfer_last.sh" "${even[@]}" > "$TMP/transfer-even.log" 2>&1 &
  RUNS=$RUNS "$R/transfer_last.sh" "${odd[@]}" > "$TMP/transfer-odd.log" 2>&1 &
  wait
  cat "$TMP/transfer-even.log" "$TMP/transfer-odd.log"
  echo "== transfer set: candidate − untrained (transfer_pairs reads B − A)"
  $PY -m experiments.manager_rl.transfer_pairs --runs "$RUNS" --seeds "$SEEDS" mgr24-base mgr24-trained
fi
rm -rf "$TMP"
