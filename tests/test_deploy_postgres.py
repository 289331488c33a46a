"""The Dagster instance on Postgres: ``deploy/dagster-postgres.yaml`` against a real PostgreSQL server that
the test starts (Debian's postgresql, as the ``postgres`` user under root), with a task batch run on it.

Skipped, with the reason, only when the server cannot start (binaries or the postgres user missing).
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest
from dagster import DagsterInstance, DagsterRunStatus, materialize
from dagster._core.events import EngineEventData
from dagster._core.test_utils import create_run_for_test
from local_servers import PostgresServer, ServerUnavailable, skip_unavailable

from assets.batch_assets import reviews, rollouts, step_scores, tasks, trajectories
from assets.resources import LakehouseResource, PolicyResource, ReviewResource, TrainerResource
from jobs.run_health import HOST_TAG, reap_dead_runs
from tentalis_pipelines.lakehouse import Lakehouse
from tentalis_pipelines.settings import Paths
from tentalis_pipelines.tasks.batches import register_generated_batch

CONFIG = Path(__file__).resolve().parents[1] / "deploy" / "dagster-postgres.yaml"
ASSETS = [tasks, rollouts, step_scores, reviews, trajectories]


@pytest.fixture(scope="module")
def pg():
    t0 = time.perf_counter()
    try:
        server = PostgresServer().start()
    except ServerUnavailable as exc:
        skip_unavailable("PostgreSQL", exc)
    print(f"\nPostgreSQL ({server.bindir}) up on port {server.port} in {time.perf_counter() - t0:.1f} s")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def instance(pg, tmp_path_factory):
    """A DagsterInstance loaded from the deploy config file, as $DAGSTER_HOME/dagster.yaml."""
    dagster_home = tmp_path_factory.mktemp("dagster_home")
    shutil.copy(CONFIG, dagster_home / "dagster.yaml")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DAGSTER_HOME", str(dagster_home))
        mp.setenv("DAGSTER_PG_URL", pg.url)
        inst = DagsterInstance.get()
        yield inst
        inst.dispose()


def _sql(pg: PostgresServer, query: str, *params) -> list[tuple]:
    """Ask the database directly (psycopg2), not through Dagster."""
    import psycopg2

    conn = psycopg2.connect(pg.url.replace("postgresql+psycopg2://", "postgresql://"))
    try:
        with conn.cursor() as cur:
            cur.execute(query, params)
            return cur.fetchall()
    finally:
        conn.close()


def test_the_config_file_gives_postgres_storage_a_run_queue_and_the_gpu_pool(instance, pg):
    assert type(instance.run_storage).__name__ == "PostgresRunStorage"
    assert type(instance.event_log_storage).__name__ == "PostgresEventLogStorage"
    assert type(instance.schedule_storage).__name__ == "PostgresScheduleStorage"
    queue = instance.get_concurrency_config().run_queue_config
    assert queue.max_concurrent_runs == 4
    assert queue.tag_concurrency_limits == [{"key": "dagster/backfill", "limit": 2}]
    assert instance.event_log_storage.get_pool_config().default_pool_limit == 1
    gpu = instance.event_log_storage.get_concurrency_info("gpu")
    assert gpu.limit == 1 and gpu.claimed_slots == [] and gpu.pending_steps == []
    # Dagster created its schema in this database.
    tables = {r[0] for r in _sql(pg, "select tablename from pg_tables where schemaname = 'public'")}
    assert {"runs", "event_logs", "dynamic_partitions", "concurrency_slots", "concurrency_limits"} <= tables


def test_a_task_batch_runs_on_the_postgres_instance(instance, pg, home, tiny_model_dir):
    paths = Paths.from_env(home).ensure()
    batch_id = register_generated_batch(paths.batches, seed=5, num_tasks=3)
    instance.add_dynamic_partitions("task_batches", [batch_id])
    resources = {
        "lakehouse": LakehouseResource(home=str(home)),
        "policy": PolicyResource(model=str(tiny_model_dir), num_generations=2, max_new_tokens=16),
        "review": ReviewResource(),
        "trainer": TrainerResource(),
    }
    t0 = time.perf_counter()
    result = materialize(ASSETS, partition_key=batch_id, instance=instance, resources=resources)
    run_s = time.perf_counter() - t0
    assert result.success
    lake = Lakehouse(paths.lakehouse)
    assert {t: lake.count(t) for t in ("tasks", "rollouts", "reviews", "trajectories")} == \
        {"tasks": 3, "rollouts": 6, "reviews": 6, "trajectories": 6}

    # Through Dagster's API: the run, its materialisations and the partition come back from Postgres.
    run = instance.get_run_by_id(result.run_id)
    assert run.status == DagsterRunStatus.SUCCESS and run.tags["dagster/partition"] == batch_id
    assert run.tags[HOST_TAG] == socket.gethostname()  # the rollouts step claimed a gpu slot and named its host
    assert batch_id in instance.get_dynamic_partitions("task_batches")
    mat = instance.fetch_materializations(rollouts.key, limit=1).records[0]
    assert mat.run_id == result.run_id and mat.asset_materialization.partition == batch_id
    assert mat.asset_materialization.metadata["dagster/row_count"].value == 6

    # In the database itself.
    assert _sql(pg, "select status from runs where run_id = %s", result.run_id) == [("SUCCESS",)]
    mats = _sql(pg, "select asset_key, partition from event_logs where run_id = %s "
                    "and dagster_event_type = 'ASSET_MATERIALIZATION'", result.run_id)
    assert sorted((json.loads(k)[0], p) for k, p in mats) == sorted((a.key.path[0], batch_id) for a in ASSETS)
    assert _sql(pg, "select partition from dynamic_partitions where partitions_def_name = 'task_batches'") == [(batch_id,)]
    # The gpu pool's slot lives in Postgres (created when rollouts claimed it) and was freed at the end.
    assert _sql(pg, "select count(*), count(run_id) from concurrency_slots where concurrency_key = 'gpu'") == [(1, 0)]
    info = instance.event_log_storage.get_concurrency_info("gpu")
    assert info.slot_count == 1 and info.claimed_slots == []

    # A re-run is a second run in Postgres; the lakehouse keeps one copy of the batch.
    again = materialize(ASSETS, partition_key=batch_id, instance=instance, resources=resources)
    assert again.success and lake.count("rollouts") == 6
    n_runs = _sql(pg, "select count(*) from runs where status = 'SUCCESS' and run_id in (%s, %s)", result.run_id, again.run_id)
    assert n_runs == [(2,)]
    assert len(instance.fetch_materializations(rollouts.key, limit=10).records) == 2
    print(f"\na batch of 3 tasks x 2 samples on the Postgres instance: {run_s:.1f} s")


def test_the_reaper_on_a_shared_instance_judges_only_runs_of_this_host(instance):
    """On Postgres a pid means nothing on another machine: a started run whose pid is not alive here is
    failed only when it recorded this host; untagged runs and other hosts' runs are left alone."""
    dead = subprocess.Popen(["true"])
    dead.wait()  # a pid that no process has now
    runs = {}
    for name, tags in [("here", {HOST_TAG: socket.gethostname()}), ("elsewhere", {HOST_TAG: "another-machine"}),
                       ("untagged", {})]:
        run = create_run_for_test(instance, job_name=f"reaper_{name}", status=DagsterRunStatus.STARTED, tags=tags)
        instance.report_engine_event("Executing steps in process", run, EngineEventData.in_process(dead.pid))
        runs[name] = run.run_id
    reaped = reap_dead_runs(instance)
    assert runs["here"] in reaped and runs["elsewhere"] not in reaped and runs["untagged"] not in reaped
    assert instance.get_run_by_id(runs["here"]).status == DagsterRunStatus.FAILURE
    assert instance.get_run_by_id(runs["elsewhere"]).status == DagsterRunStatus.STARTED
    assert instance.get_run_by_id(runs["untagged"]).status == DagsterRunStatus.STARTED
