"""Retraction reaches every copy (issue 33, must-hold 5): after `tentalis retract --review ID`, no file
the project wrote under $TENTALIS_HOME holds the retracted text: not the lakehouse (data files and
`_delta_log`), not the checkpoint folders, not the Dagster instance (its SQLite run, event log and
schedule storage, compute logs, local artifact storage).

The review is a person's, imported with `tentalis import-reviews` and picked up by materialising the
batch's ``reviews`` (and ``teacher_logprobs``, ``trajectories``) again with ``review.manager = human``,
as a manager does from the UI; a checkpoint is then trained on it, so the retraction also moves serving.
The same on the Postgres instance (``deploy/dagster-postgres.yaml``, a real server as in
tests/test_deploy_postgres.py): every row of every table in its database is searched as text.
"""

from __future__ import annotations

import json
import shutil
import uuid
from pathlib import Path

import pytest
from local_servers import PostgresServer, ServerUnavailable, skip_unavailable
from typer.testing import CliRunner

ROOT = Path(__file__).resolve().parents[1]


def files_holding(root: Path, needle: bytes) -> list[str]:
    """Every file under ``root`` whose bytes contain ``needle`` (SQLite files with their -wal/-journal
    siblings, logs, JSON, parquet, Delta logs, ...)."""
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and needle in p.read_bytes())


def run_batch_with_human_review(instance, paths, model_dir: Path, marker: str, outside: Path, *, train: bool = True) -> dict:
    """On ``instance``: batch 1 (`tentalis run --no-train`), a person's review of one rollout carrying
    ``marker`` in its critique and hint, the batch's reviews, teacher_logprobs and trajectories
    materialised again, then (``train``) `tentalis run` (batch 2, training, benchmark, promotion)."""
    from dagster import AssetKey

    from jobs.runner import CycleOptions, run_cycle
    from tentalis_pipelines.definitions import defs
    from tentalis_pipelines.lakehouse import Lakehouse
    from tentalis_pipelines.stages.human_reviews import import_human_reviews

    resources = {
        "lakehouse": {"config": {"home": str(paths.home)}},
        "policy": {"config": {"model": str(model_dir), "num_generations": 2, "max_new_tokens": 8}},
        "review": {"config": {"manager": "human"}},
        "trainer": {"config": {"w_opd": 0.5}},  # the hint reaches teacher_logprobs and the OPD signal
        "benchmark": {"config": {"limit": 2, "max_new_tokens": 8, "benchmarks": ["arithmetic"], "gate_benchmark": "arithmetic"}},
    }
    lake = Lakehouse(paths.lakehouse)
    opts = CycleOptions(num_tasks=2, seed=1, levels=(1,), train=False, resources=resources, trigger="retraction-test")
    batch_id = run_cycle(defs, instance, paths, opts)["batch_id"]
    target = lake.read("rollouts", batch_id=batch_id).to_pylist()[0]
    # The person's file lives outside $TENTALIS_HOME: it is theirs, not something the project wrote.
    file = outside / "reviews.jsonl"
    file.write_text(json.dumps({"rollout_id": target["rollout_id"], "score": 1.0, "reviewer": "retraction-test",
                                "critique": f"{marker}-critique: step two drops the carry",
                                "hint": f"{marker}-hint: add the tens before the units"}) + "\n")
    import_human_reviews(lake, file)
    result = defs.resolve_job_def("rollout_job").execute_in_process(
        run_config={"resources": resources}, instance=instance, partition_key=batch_id,
        asset_selection=[AssetKey("reviews"), AssetKey("teacher_logprobs"), AssetKey("trajectories")],
        tags={"tentalis/trigger": "retraction-test"})
    assert result.success
    trained = run_cycle(defs, instance, paths, CycleOptions(num_tasks=2, seed=2, levels=(1,), train=True, resources=resources,
                                                            trigger="retraction-test")) if train else {"checkpoint_id": None}
    review = next(r for r in lake.read("reviews", batch_id=batch_id).to_pylist() if marker in (r["critique"] or ""))
    return {"batch_id": batch_id, "review": review, "checkpoint_id": trained["checkpoint_id"]}


def retract_review(home: Path, review: dict, marker: str) -> dict:
    """`tentalis retract --review ID --json`; its output names no retracted text."""
    from tentalis_pipelines import lineage
    from tentalis_pipelines.cli import app

    key = review["review_id"] or lineage.review_key(review)
    res = CliRunner().invoke(app, ["retract", "--review", key, "--reason", "the reviewer withdrew it", "--json", "--home", str(home)])
    assert res.exit_code == 0, res.output
    assert marker not in res.output
    out = json.loads(res.output)
    assert out["deleted"]["reviews"] >= 1 and out["deleted"]["human_reviews"] == 1
    return out


def test_retracted_review_text_is_in_no_file_under_home(home: Path, tiny_model_dir: Path, tmp_path: Path):
    from dagster import DagsterInstance

    from tentalis_pipelines.settings import Paths

    marker = f"RETRACTME{uuid.uuid4().hex}"
    outside = tmp_path / "person"
    outside.mkdir()
    paths = Paths.from_env(home).ensure()
    shutil.copy(ROOT / "dagster.yaml", paths.dagster_home / "dagster.yaml")
    with DagsterInstance.from_config(str(paths.dagster_home)) as instance:
        state = run_batch_with_human_review(instance, paths, tiny_model_dir, marker, outside)
    assert files_holding(home, marker.encode()), "the search must see the text where it is (the lakehouse) before the retraction"
    out = retract_review(home, state["review"], marker)
    assert state["checkpoint_id"] in out["affected"]  # trained on it: serving moved off it

    leaks = files_holding(home, marker.encode())
    assert leaks == [], f"the retracted text is still in {leaks}"


@pytest.fixture()
def pg():
    try:
        server = PostgresServer().start()
    except ServerUnavailable as exc:
        skip_unavailable("PostgreSQL", exc)
    yield server
    server.stop()


def postgres_rows_holding(url: str, needle: str) -> list[str]:
    """``table: count`` for every table of the database's public schema with a row whose text form
    holds ``needle`` (each row cast to text: JSON event bodies, run configs, tags, ...)."""
    import psycopg2
    from psycopg2 import sql

    conn = psycopg2.connect(url.replace("postgresql+psycopg2://", "postgresql://"))
    try:
        with conn.cursor() as cur:
            cur.execute("select tablename from pg_tables where schemaname = 'public'")
            tables = sorted(r[0] for r in cur.fetchall())
            assert {"runs", "event_logs", "asset_keys"} <= set(tables)
            hits = []
            for t in tables:
                cur.execute(sql.SQL("select count(*) from {} as t where strpos(t::text, %s) > 0").format(sql.Identifier(t)), (needle,))
                n = cur.fetchone()[0]
                if n:
                    hits.append(f"{t}: {n}")
            return hits
    finally:
        conn.close()


def test_retracted_review_text_is_in_no_row_of_the_postgres_instance(pg, home: Path, tiny_model_dir: Path, tmp_path: Path, monkeypatch):
    from dagster import DagsterInstance

    from tentalis_pipelines.settings import Paths

    marker = f"RETRACTME{uuid.uuid4().hex}"
    outside = tmp_path / "person"
    outside.mkdir()
    paths = Paths.from_env(home).ensure()
    shutil.copy(ROOT / "deploy" / "dagster-postgres.yaml", paths.dagster_home / "dagster.yaml")
    monkeypatch.setenv("DAGSTER_PG_URL", pg.url)
    with DagsterInstance.from_config(str(paths.dagster_home)) as instance:
        assert type(instance.event_log_storage).__name__ == "PostgresEventLogStorage"
        state = run_batch_with_human_review(instance, paths, tiny_model_dir, marker, outside, train=False)
    retract_review(home, state["review"], marker)

    assert postgres_rows_holding(pg.url, marker) == []
    assert files_holding(home, marker.encode()) == []
