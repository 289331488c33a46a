#!/bin/bash
# usage: evals.sh HOME CHECKPOINT BENCH...
home=$1; ck=$2; shift 2
cd "$(dirname "$0")/../.."
for b in "$@"; do
  echo "== $b $ck $(date)"
  TENTALIS_HOME=$home OMP_NUM_THREADS=1 .venv/bin/tentalis benchmark --checkpoint $ck --tasks $b --format json 2>&1 | grep -av "Loading\|Convert\|Writing" | tail -c 600
done
echo "done $(date)"
