# The lab scripts' shared setting, sourced after `set -euo pipefail`: where the homes live ($RUNS), the code and its
# Python, the benchmark data, one MKL thread and $OMP_NUM_THREADS (default 1; a script may set its own default before
# sourcing), no DAGSTER_HOME (each home's own), and $T, the tentalis CLI.
RUNS=${RUNS:-/work/runs}
CODE=${CODE:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}
PY=${PY:-/work/main/.venv/bin/python}
export PYTHONPATH=$CODE TENTALIS_DATA_DIR=${TENTALIS_DATA_DIR:-/work/shared/data} MKL_NUM_THREADS=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
unset DAGSTER_HOME
T="$PY -m tentalis_pipelines.cli"

# run_jobs TAG NAME:SEED ...: the caller's `job SEED` for each argument, at most $SLOTS (2) at a time, each logged to
# $LOGS/TAG-NAME-sSEED.log (LOGS default /work/logs); returns when all are done.
run_jobs() {
  local tag=$1 x running=0
  shift
  for x in "$@"; do
    if [ "$running" -ge "${SLOTS:-2}" ]; then wait -n || true; running=$((running - 1)); fi
    job "${x##*:}" > "${LOGS:-/work/logs}/$tag-${x%%:*}-s${x##*:}.log" 2>&1 &
    running=$((running + 1))
  done
  wait
}
