"""The judge PRM and the llm manager inside the pipeline (real models)."""

import json

import pytest
from dagster import DagsterInstance, materialize

from assets.batch_assets import reviews, rollouts, step_scores, tasks, trajectories
from assets.resources import LakehouseResource, PolicyResource, ReviewResource, TrainerResource
from tentalis_pipelines.lakehouse import Lakehouse
from tentalis_pipelines.rewards.llm_manager import parse_review
from tentalis_pipelines.settings import Paths
from tentalis_pipelines.stages.step_scores import UNFORMATTED, build_step_scores, in_step_format
from tentalis_pipelines.tasks.batches import register_generated_batch


def test_parse_review_is_tolerant():
    assert parse_review('{"score": 8, "critique": "Good.", "hint": "Tag it."}') == (0.8, "Good.", "Tag it.")
    assert parse_review("Score: 3\nThe sum is wrong.")[0] == 0.3
    assert parse_review("no idea") is None and parse_review('{"score": 42}') is None


@pytest.mark.integration
def test_embedded_judge_scores_every_step_with_num_votes_votes(home, embedded_model_dir):
    paths = Paths.from_env(home).ensure()
    (paths.models / embedded_model_dir.name).symlink_to(embedded_model_dir, target_is_directory=True)
    batch_id = register_generated_batch(paths.batches, seed=11, num_tasks=2, levels=(1,))
    resources = {
        "lakehouse": LakehouseResource(home=str(home)),
        "policy": PolicyResource(num_generations=2, max_new_tokens=32),
        "review": ReviewResource(step_scorer="judge", num_votes=3, manager="llm", manager_max_new_tokens=32),
        "trainer": TrainerResource(),
    }
    with DagsterInstance.ephemeral() as inst:
        inst.add_dynamic_partitions("task_batches", [batch_id])
        assert materialize([tasks, rollouts, step_scores, reviews, trajectories], partition_key=batch_id, instance=inst,
                           resources=resources).success
    lake = Lakehouse(paths.lakehouse)
    rollouts_ = lake.read("rollouts").to_pylist()
    formatted = {r["rollout_id"] for r in rollouts_ if in_step_format(r["completion"])}
    scores = lake.read("step_scores").to_pylist()
    assert len(scores) == sum(len(r["steps"]) for r in rollouts_) > 0
    # the judge votes num_votes times on the steps of formatted completions; the others' lines stay unscored
    assert all(r["scorer"] == "judge" and r["score"] in (-1.0, 0.0, 1.0, None) for r in scores)
    assert all(len(r["votes"]) == 3 if r["rollout_id"] in formatted else (r["votes"], r["score"], r["rationale"]) == ([], None, UNFORMATTED)
               for r in scores)
    # the base model rarely writes tags in 32 tokens: a formatted completion of the same batch, through the same stage
    task = lake.read("tasks", batch_id=batch_id).to_pylist()[0]
    text = "<step>2 + 2 = 4</step>\n<step>4 * 3 = 12</step>\n<answer>12</answer>"
    first = next(r for r in rollouts_ if r["task_id"] == task["task_id"])
    lake.write_batch("rollouts", "fmt", [{**first, "batch_id": "fmt", "rollout_id": "fmt-0", "completion": text,
                                          "steps": ["2 + 2 = 4", "4 * 3 = 12"], "answer": "12", "parse_mode": "tagged"}])
    lake.write_batch("tasks", "fmt", [{**task, "batch_id": "fmt"}])
    build_step_scores(lake, "fmt", scorer="judge", judge=resources["review"].step_judge(paths))
    judged = lake.read("step_scores", batch_id="fmt").to_pylist()
    assert len(judged) == 2 and all(len(r["votes"]) == 3 and r["rationale"] != UNFORMATTED for r in judged)
    revs = lake.read("reviews").to_pylist()
    assert len(revs) == 4 and all(0.0 <= r["score"] <= 1.0 and r["critique"] for r in revs)
    weights = json.loads(lake.read("trajectories").to_pylist()[0]["reward_weights"])
    assert set(weights) == {"outcome", "format", "process", "manager"}
