"""The per-batch assets through Dagster on an ephemeral instance (tiny random model, real tokenizer)."""

import json

import pytest
from dagster import DagsterInstance, materialize

from assets.batch_assets import reviews, rollouts, step_scores, tasks, trajectories
from tentalis_pipelines.lakehouse import Lakehouse
from tentalis_pipelines.resources import LakehouseResource, PolicyResource, ReviewResource, TrainerResource
from tentalis_pipelines.settings import Paths
from tentalis_pipelines.tasks.batches import register_file_batch

TABLES = ["tasks", "rollouts", "step_scores", "reviews", "trajectories", "quarantine"]


@pytest.fixture()
def instance():
    with DagsterInstance.ephemeral() as inst:
        yield inst


def test_inbox_batch_with_malformed_lines_runs_and_reruns_idempotently(instance, home, tiny_model_dir):
    paths = Paths.from_env(home).ensure()
    src = paths.inbox / "mixed.jsonl"
    src.write_text(
        "\n".join(
            [
                json.dumps({"question": "Ann has 2 pens and buys 3. How many pens?", "answer": "2+3=5\n#### 5"}),
                '{"prompt": "broken',
                json.dumps({"prompt": "What is 6*7?", "reference": "42"}),
                json.dumps({"prompt": "", "reference": "1"}),
                json.dumps({"prompt": "What is 10-4?", "reference": "6"}),
            ]
        )
        + "\n"
    )
    batch_id = register_file_batch(paths.batches, src)
    instance.add_dynamic_partitions("task_batches", [batch_id])
    resources = {
        "lakehouse": LakehouseResource(home=str(home)),
        "policy": PolicyResource(model=str(tiny_model_dir), num_generations=3, max_new_tokens=16),
        "review": ReviewResource(),
        "trainer": TrainerResource(),
    }
    assets = [tasks, rollouts, step_scores, reviews, trajectories]
    lake = Lakehouse(paths.lakehouse)

    assert materialize(assets, partition_key=batch_id, instance=instance, resources=resources).success
    counts = {t: lake.count(t) for t in TABLES}
    assert counts["tasks"] == 3 and counts["rollouts"] == 9 and counts["trajectories"] == 9 and counts["reviews"] == 9
    q = lake.read("quarantine").to_pylist()
    assert sorted(r["line"] for r in q) == [2, 4] and all(r["source"] == str(src) for r in q)
    traj = lake.read("trajectories").to_pylist()
    assert {t["policy_version"] for t in traj} == {"base"}
    assert all(json.loads(t["reward_weights"])["manager"] > 0 for t in traj)

    assert materialize(assets, partition_key=batch_id, instance=instance, resources=resources).success
    assert {t: lake.count(t) for t in TABLES} == counts
    mats = instance.fetch_materializations(rollouts.key, limit=10).records
    assert len(mats) == 2 and mats[0].asset_materialization.partition == batch_id
