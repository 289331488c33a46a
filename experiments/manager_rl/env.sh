# The lab scripts' shared setting, sourced after `set -euo pipefail`: where the homes live ($RUNS), the code and its
# Python, the benchmark data, one MKL thread and $OMP_NUM_THREADS (default 1; a script may set its own default before
# sourcing), no DAGSTER_HOME (each home's own), and $T, the tentalis CLI.
RUNS=${RUNS:-/work/runs}
CODE=${CODE:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}
PY=${PY:-/work/main/.venv/bin/python}
export PYTHONPATH=$CODE TENTALIS_DATA_DIR=${TENTALIS_DATA_DIR:-/work/shared/data} MKL_NUM_THREADS=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
unset DAGSTER_HOME
T="$PY -m tentalis_pipelines.cli"
