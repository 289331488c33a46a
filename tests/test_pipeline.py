"""The per-batch assets through Dagster on an ephemeral instance (tiny random model, real tokenizer)."""

import json

import pytest
from dagster import DagsterInstance, materialize

from assets.batch_assets import reviews, rollouts, step_scores, tasks, trajectories
from assets.resources import LakehouseResource, PolicyResource, ReviewResource, TrainerResource
from tentalis_pipelines.lakehouse import Lakehouse
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

    first = materialize(assets, partition_key=batch_id, instance=instance, resources=resources)
    assert first.success
    checks = {e.check_name: e.passed for e in first.get_asset_check_evaluations()}
    assert checks == {"no_held_out_items": True, "rollouts_per_task": True, "one_review_per_rollout": True,
                      "rewards_in_range": True}
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


def _inbox_batch(paths, name: str, data: bytes) -> str:
    src = paths.inbox / name
    src.write_bytes(data)
    return register_file_batch(paths.batches, src)


def test_one_bad_line_costs_only_that_line(instance, home, tiny_model_dir):
    """bool/huge difficulty, bool reference, NaN metadata, invalid UTF-8 and a 5 MB prompt are each
    quarantined with their line number; the valid lines become tasks and roll out (issue 11)."""
    paths = Paths.from_env(home).ensure()
    lines = [
        json.dumps({"prompt": "What is 1+1?", "reference": "2"}).encode(),
        json.dumps({"prompt": "What is 2+2?", "reference": "4", "difficulty": True}).encode(),
        b'{"prompt": "What is 3+3?", "reference": "6", "difficulty": 1000000000000000000000000000000}',
        json.dumps({"prompt": "What is 4+4?", "reference": True}).encode(),
        b'{"prompt": "What is 5+5?", "reference": "10", "metadata": {"x": NaN}}',
        b'{"prompt": "What is caf\xe9?", "reference": "1"}',
        json.dumps({"prompt": "word " * 1_000_000, "reference": "1"}).encode(),
        json.dumps({"prompt": "What is 6*7?", "reference": 42}).encode(),
    ]
    batch_id = _inbox_batch(paths, "hostile.jsonl", b"\n".join(lines) + b"\n")
    instance.add_dynamic_partitions("task_batches", [batch_id])
    resources = {"lakehouse": LakehouseResource(home=str(home)),
                 "policy": PolicyResource(model=str(tiny_model_dir), num_generations=2, max_new_tokens=4, max_prompt_tokens=512)}
    assert materialize([tasks, rollouts], partition_key=batch_id, instance=instance, resources=resources).success
    lake = Lakehouse(paths.lakehouse)
    assert sorted(t["prompt"] for t in lake.read("tasks").to_pylist()) == ["What is 1+1?", "What is 6*7?"]
    from dagster import AssetKey

    event = instance.get_latest_materialization_event(AssetKey("rollouts"))
    meta = event.asset_materialization.metadata
    assert meta["dagster/uri"].value == lake.uri("rollouts") and meta["dagster/row_count"].value == 4
    assert lake.count("rollouts") == 4
    q = {r["line"]: r["error"] for r in lake.read("quarantine").to_pylist()}
    assert set(q) == {2, 3, 4, 5, 6, 7}, q
    assert "'difficulty' must be an integer" in q[2] and "between 0 and" in q[3] and "text or a number" in q[4]
    assert "NaN" in q[5] and "not valid UTF-8" in q[6] and "tokens; the limit is 512" in q[7]
    assert "\ufffd" not in "".join(t["prompt"] for t in lake.read("tasks").to_pylist())


@pytest.mark.parametrize("data, why", [
    (b"", "it has no non-blank line"),
    (b"\n   \n\t\n", "it has no non-blank line"),
    (b'{"prompt": ""}\nnot json\n', "2 line(s) quarantined"),
])
def test_a_file_without_a_valid_task_fails_at_tasks_naming_why(instance, home, tiny_model_dir, data, why):
    from tentalis_pipelines.stages.tasks import NoValidTasks, build_tasks
    paths = Paths.from_env(home).ensure()
    batch_id = _inbox_batch(paths, "empty.jsonl", data)
    import re

    with pytest.raises(NoValidTasks, match=re.escape(f"has no valid task: {why}")) as err:
        build_tasks(Lakehouse(paths.lakehouse), paths, batch_id)
    assert "empty.jsonl" in str(err.value)
