#!/bin/sh
# The full official multi_turn_base run (200 items, BFCL's 20-step limit), niced, resumable: rerun this
# script and it skips the items already in episodes_official200.csv under the same settings. On two cores, two
# shards (each its own CSV, merged afterwards):
#   OUT=experiments/bfcl_base/official200.shard0.csv run_full.sh --shard 0/2 --done-in experiments/bfcl_base/episodes_official200.csv
cd "$(dirname "$0")/../.." || exit 1
PYTHONPATH=. OMP_NUM_THREADS=1 exec nice -n 19 "${PYTHON:-.venv/bin/python}" -m experiments.bfcl_base.run \
    --models-dir "${MODELS_DIR:-.tentalis/models}" --official 200 --generated-per-level 0 --max-steps 20 \
    --out "${OUT:-experiments/bfcl_base/episodes_official200.csv}" "$@"
