"""The lakehouse on object storage: ``TENTALIS_LAKEHOUSE_URI=s3://...`` against a real S3 server (moto's,
started here on 127.0.0.1), with a task batch through the per-batch assets, a re-run, DuckDB SQL,
maintenance, and two writer processes committing to the same tables at once.

Skipped, with the reason, only when the server cannot start (``moto[server]`` missing, no free port).
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
from dagster import DagsterInstance, materialize
from local_servers import S3Server, ServerUnavailable, skip_unavailable

from assets.batch_assets import reviews, rollouts, step_scores, tasks, trajectories
from assets.resources import LakehouseResource, PolicyResource, ReviewResource, TrainerResource
from tentalis_pipelines.lakehouse import Lakehouse, storage_options_from_env
from tentalis_pipelines.settings import Paths, lakehouse_location
from tentalis_pipelines.tasks.batches import register_generated_batch
from tentalis_pipelines.training.checkpoints import lakehouse_lock

BUCKET = "tentalis-lake"
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def s3():
    try:
        server = S3Server().start()
    except ServerUnavailable as exc:
        skip_unavailable("the S3 test server", exc)
    server.client().create_bucket(Bucket=BUCKET)
    yield server
    server.stop()


@pytest.fixture()
def s3_lake(s3, home, monkeypatch) -> str:
    """A fresh prefix in the bucket as $TENTALIS_LAKEHOUSE_URI, with the server's AWS_* variables set."""
    for key, value in s3.env.items():
        monkeypatch.setenv(key, value)
    uri = f"s3://{BUCKET}/{uuid.uuid4().hex[:12]}/lakehouse"
    monkeypatch.setenv("TENTALIS_LAKEHOUSE_URI", uri)
    return uri


def _objects(s3, uri: str) -> list[str]:
    prefix = uri.split(f"s3://{BUCKET}/", 1)[1] + "/"
    pages = s3.client().get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix)
    return [o["Key"][len(prefix):] for page in pages for o in page.get("Contents", [])]


# ------------------------------------------------------------------ settings (no server needed)
def test_lakehouse_uri_setting_and_storage_options(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("TENTALIS_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("TENTALIS_LAKEHOUSE_URI", raising=False)
    assert Paths.from_env().lakehouse == tmp_path / "home" / "lakehouse"  # unset: local, as before
    monkeypatch.setenv("TENTALIS_LAKEHOUSE_URI", "s3://bucket/team/lake/")
    paths = Paths.from_env().ensure()
    assert paths.lakehouse == "s3://bucket/team/lake" and not (tmp_path / "home" / "lakehouse").exists()
    assert lakehouse_location(f"file://{tmp_path}/x") == tmp_path / "x"
    for bad, why in [("s3://", "names no bucket"), ("ftp://h/x", "unsupported"), ("s3://key:secret@bucket/x", "credentials")]:
        with pytest.raises(ValueError, match=why) as err:
            lakehouse_location(bad)
        assert "secret" not in str(err.value)

    env = {"AWS_ENDPOINT_URL": "http://127.0.0.1:9", "AWS_ACCESS_KEY_ID": "AKIA", "AWS_SECRET_ACCESS_KEY": "s3cr3t",
           "AWS_DEFAULT_REGION": "eu-west-1", "AWS_ALLOW_HTTP": "true", "HOME": "/root"}
    options = storage_options_from_env("s3://bucket/lake", env)
    assert options == {"AWS_ENDPOINT_URL": "http://127.0.0.1:9", "AWS_ACCESS_KEY_ID": "AKIA", "AWS_SECRET_ACCESS_KEY": "s3cr3t",
                       "AWS_REGION": "eu-west-1", "AWS_ALLOW_HTTP": "true", "AWS_CONDITIONAL_PUT": "etag"}
    assert storage_options_from_env(str(tmp_path), env) is None and storage_options_from_env("gs://b/x", env) is None
    with caplog.at_level(logging.WARNING):
        storage_options_from_env("s3://bucket/unsafe", {**env, "AWS_S3_ALLOW_UNSAFE_RENAME": "true"})
    assert "single writer" in caplog.text and "s3cr3t" not in caplog.text
    lake = Lakehouse("s3://bucket/lake/", storage_options=options)
    assert lake.is_object_store and lake.uri("tasks") == "s3://bucket/lake/tasks"
    assert "s3cr3t" not in repr(lake) and "s3cr3t" not in str(vars(lake).get("root"))


def test_training_lock_on_object_storage_is_per_machine_and_says_so(tmp_path, monkeypatch, caplog):
    """No file locks on S3: the lock lives under $TENTALIS_HOME/locks, excludes this machine's processes,
    and a warning names the gpu pool as the cross-machine guard."""
    monkeypatch.setenv("TENTALIS_HOME", str(tmp_path / "home"))
    lake = Lakehouse("s3://bucket/locks-test", storage_options={"AWS_REGION": "us-east-1"})
    with caplog.at_level(logging.WARNING), lakehouse_lock(lake, "training"):
        locks = list((tmp_path / "home" / "locks").rglob("training.lock"))
        assert len(locks) == 1
        with pytest.raises(TimeoutError, match="training.lock"):
            _take_in_thread(lake, timeout=0.3)
    assert "this machine only" in caplog.text and "gpu pool" in caplog.text
    _take_in_thread(lake, timeout=2.0)  # released: another taker gets it


def _take_in_thread(lake: Lakehouse, timeout: float) -> None:
    errors: list[BaseException] = []

    def take():
        try:
            with lakehouse_lock(lake, "training", timeout=timeout):
                pass
        except BaseException as exc:  # noqa: B036 - handed back to the test
            errors.append(exc)

    t = threading.Thread(target=take)
    t.start()
    t.join()
    if errors:
        raise errors[0]


# ------------------------------------------------------------------ a batch through the assets
def test_a_task_batch_runs_through_the_assets_on_s3(s3, s3_lake, home, tiny_model_dir):
    paths = Paths.from_env(home).ensure()
    batch_id = register_generated_batch(paths.batches, seed=11, num_tasks=4)
    resources = {
        "lakehouse": LakehouseResource(home=str(home)),
        "policy": PolicyResource(model=str(tiny_model_dir), num_generations=3, max_new_tokens=16),
        "review": ReviewResource(),
        "trainer": TrainerResource(),
    }
    lake = resources["lakehouse"].lakehouse()
    assert lake.is_object_store and lake.root == s3_lake
    with DagsterInstance.ephemeral() as instance:
        instance.add_dynamic_partitions("task_batches", [batch_id])
        t0 = time.perf_counter()
        result = materialize([tasks, rollouts, step_scores, reviews, trajectories], partition_key=batch_id,
                             instance=instance, resources=resources)
        first_s = time.perf_counter() - t0
        assert result.success
        counts = {t: lake.count(t) for t in ("tasks", "rollouts", "reviews", "trajectories")}
        assert counts == {"tasks": 4, "rollouts": 12, "reviews": 12, "trajectories": 12}
        assert lake.count("step_scores") > 0
        meta = instance.fetch_materializations(rollouts.key, limit=1).records[0].asset_materialization.metadata
        assert meta["dagster/uri"].value == f"{s3_lake}/rollouts" and meta["dagster/row_count"].value == 12

        # The rows are in the bucket, not on the local disk.
        keys = _objects(s3, s3_lake)
        for table in ("tasks", "rollouts", "step_scores", "reviews", "trajectories"):
            assert f"{table}/_delta_log/00000000000000000000.json" in keys
            assert any(k.startswith(f"{table}/batch_id={batch_id}/") and k.endswith(".parquet") for k in keys), table
        assert not (home / "lakehouse").exists()
        rollout_ids = sorted(lake.read("rollouts", batch_id=batch_id, columns=["rollout_id"]).column("rollout_id").to_pylist())

        # A re-run replaces the batch's rows (one overwrite commit per table), never duplicates them.
        v_before = lake.table("rollouts").version()
        assert materialize([tasks, rollouts, step_scores, reviews, trajectories], partition_key=batch_id,
                           instance=instance, resources=resources).success
        assert {t: lake.count(t) for t in counts} == counts
        dt = lake.table("rollouts")
        assert dt.version() == v_before + 1
        last = dt.history(1)[0]
        assert last["operation"] == "WRITE" and last["operationParameters"]["mode"] == "Overwrite"
        assert batch_id in last["operationParameters"]["predicate"]
        assert sorted(lake.read("rollouts", columns=["rollout_id"]).column("rollout_id").to_pylist()) == rollout_ids

    # DuckDB SQL over the S3 tables.
    n, distinct = lake.sql("select count(*), count(distinct rollout_id) from trajectories "
                           f"where batch_id = '{batch_id}'").to_pylist()[0].values()
    assert n == distinct == 12
    joined = lake.sql("select count(*) as n from rollouts r join reviews v using (batch_id, rollout_id)").to_pylist()
    assert joined == [{"n": 12}]
    con = lake.duckdb(["trajectories"])
    avg_sql = con.execute("select avg(reward) from trajectories").fetchone()[0]
    con.close()
    rewards = lake.read("trajectories", columns=["reward"]).column("reward").to_pylist()
    assert avg_sql == pytest.approx(sum(rewards) / len(rewards))

    # Maintenance on S3: compaction keeps the rows, vacuum deletes the replaced files from the bucket.
    parquet = [k for k in _objects(s3, s3_lake) if k.startswith("rollouts/batch_id=")]
    assert len(parquet) == 2  # the first run's file (replaced, kept for time travel) and the re-run's
    report = lake.maintain("rollouts", retention_hours=0, allow_unsafe_retention=True)
    assert report["rows_before"] == report["rows_after"] == 12 and report["vacuumed_files"] == 1
    assert report["checkpoint_version"] == lake.table("rollouts").version()
    assert len([k for k in _objects(s3, s3_lake) if k.startswith("rollouts/batch_id=")]) == 1
    assert lake.count("rollouts") == 12
    print(f"\nfirst materialisation on S3: {first_s:.1f} s")


# ------------------------------------------------------------------ concurrent writers
WORKER = r"""
import sys, time
from datetime import datetime, timezone
from deltalake.exceptions import CommitFailedError
import tentalis_pipelines.lakehouse as lh

uri, writer, batches, start = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
lake = lh.Lakehouse(uri)
conflicts = 0
write = lh.write_deltalake

def counting_write(*args, **kwargs):  # counts the commit races this writer lost (Lakehouse._commit retries them)
    global conflicts
    try:
        return write(*args, **kwargs)
    except CommitFailedError:
        conflicts += 1
        raise

lh.write_deltalake = counting_write

def rows(batch, n):
    return [{"batch_id": batch, "task_id": f"{writer}-{i}", "source": writer, "environment": "math",
             "prompt": f"{i}+1?", "reference": str(i + 1), "difficulty": 1, "metadata": "{}",
             "created_at": datetime.now(timezone.utc)} for i in range(n)]

time.sleep(max(0.0, start - time.time()))
t0 = time.perf_counter()
for k in range(batches):
    lake.write_batch("tasks", f"{writer}-b{k}", rows(f"{writer}-b{k}", 4))  # its own partition
    lake.write_batch("tasks", "shared", rows("shared", 6))                  # the same partition as the other writer
    lake.quarantine([{"source": writer, "line": k, "raw": "{", "error": "test"}])  # appends, unpartitioned table
print(f"{writer}: {3 * batches} commits in {time.perf_counter() - t0:.2f} s, {conflicts} lost races retried")
"""


def test_two_writer_processes_on_one_s3_table_lose_nothing(s3, s3_lake):
    """Two processes (as two machines would) create and write the same tables at once. Every commit lands
    (the table's version count is exact), every batch has its rows, and the partition both replaced
    holds exactly one writer's rows: conditional puts decide each commit race, and the loser retries."""
    batches = 5
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    start = time.time() + 4.0  # both start committing at the same moment, after their imports
    procs = [subprocess.Popen([sys.executable, "-c", WORKER, s3_lake, w, str(batches), str(start)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for w in ("w1", "w2")]
    outs = [p.communicate(timeout=240) for p in procs]
    for p, (_out, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]
    print("\n" + "".join(out for out, _ in outs))

    lake = Lakehouse(s3_lake)
    for w in ("w1", "w2"):
        for k in range(batches):
            assert lake.count("tasks", batch_id=f"{w}-b{k}") == 4, (w, k)
    shared = lake.read("tasks", batch_id="shared").to_pylist()
    assert len(shared) == 6 and len({r["source"] for r in shared}) == 1
    assert sorted(r["task_id"] for r in shared) == sorted(f"{shared[0]['source']}-{i}" for i in range(6))
    assert lake.count("tasks") == 2 * batches * 4 + 6
    # 4 commits per round (2 writers x 2 writes): versions 0 .. 4*batches-1, none overwritten or lost.
    assert lake.table("tasks").version() == 4 * batches - 1
    q = lake.read("quarantine").to_pylist()
    assert sorted((r["source"], r["line"]) for r in q) == sorted((w, k) for w in ("w1", "w2") for k in range(batches))
    assert lake.table("quarantine").version() == 2 * batches - 1
    commits = [k for k in _objects(s3, s3_lake) if k.startswith("tasks/_delta_log/") and k.endswith(".json")]
    assert len(commits) == 4 * batches
