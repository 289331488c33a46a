"""Dagster assets: thin wrappers that read tables, call a stage of ``tentalis_pipelines.stages`` and write tables."""

from jobs.run_health import install as _install_run_health

# Every process that loads these assets (dagster CLI, webserver, daemon, materialize() from Python) frees
# the pool slots of killed runs and sleeps while a step waits for one (jobs/run_health.py).
_install_run_health()
