#!/usr/bin/env bash
# One learning cycle from CI with plain `dagster job execute`: the same asset jobs that `tentalis run`
# and the automation run. The README's "In CI" block is the part between the markers, verbatim
# (tests/test_integration.py checks it and runs this file).
# Optional: RUN_CONFIG=run.yaml (resource settings), NUM_TASKS (16), SEED (next unused), BIN (.venv/bin).
set -euo pipefail
export PATH="$(cd "${BIN:-.venv/bin}" && pwd):$PATH"
# --- begin README
tentalis init
batch=$(tentalis batch new --num-tasks "${NUM_TASKS:-16}" ${SEED:+--seed "$SEED"})
dagster job execute -m tentalis_pipelines.definitions ${RUN_CONFIG:+-c "$RUN_CONFIG"} -j rollout_job \
  --tags "{\"dagster/partition\": \"$batch\"}"
dagster job execute -m tentalis_pipelines.definitions ${RUN_CONFIG:+-c "$RUN_CONFIG"} -j train_job
ckpt=$(tentalis sql "select checkpoint_id from checkpoints order by created_at desc limit 1" --format csv | tail -n 1)
for c in base "$ckpt"; do  # the gate benchmark for the incumbent (here: the base model) and the candidate
  dagster job execute -m tentalis_pipelines.definitions ${RUN_CONFIG:+-c "$RUN_CONFIG"} -j benchmark_job \
    --tags "{\"dagster/partition/checkpoint\": \"$c\", \"dagster/partition/benchmark\": \"arithmetic\"}"
done
dagster job execute -m tentalis_pipelines.definitions ${RUN_CONFIG:+-c "$RUN_CONFIG"} -j promotion_job
# --- end README
