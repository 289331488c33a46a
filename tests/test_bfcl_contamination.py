"""A BFCL batch that reproduces an official item is refused at the tasks stage (the contamination screen).

An integration test: the screen's embedding tier loads MiniLM (``contamination.load_embedding_model``), so
it cannot live in tests/unit, whose guard refuses a test that builds a model. Run alone after the unit
suite had imported transformers, it was refused there; in the full run an earlier test had cached the model.
"""

from __future__ import annotations

import pytest

pytest.importorskip("bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker")

from tentalis_pipelines.envs import bfcl  # noqa: E402
from tentalis_pipelines.lakehouse import Lakehouse  # noqa: E402
from tentalis_pipelines.settings import Paths  # noqa: E402
from tentalis_pipelines.stages.tasks import build_tasks  # noqa: E402
from tentalis_pipelines.tasks import batches  # noqa: E402


@pytest.fixture(scope="module")
def official():
    return {t.task_id: t for t in bfcl.load_official()}


def test_a_bfcl_batch_that_reproduces_an_official_item_is_refused(home, monkeypatch, official):
    monkeypatch.setenv("TENTALIS_CONTAMINATION_BENCHMARKS", "arithmetic,bfcl")
    paths = Paths.from_env(home).ensure()
    lake = Lakehouse(paths.lakehouse)
    batch_id = batches.register_bfcl_batch(paths.batches, seed=3, num_tasks=4, levels=(1, 2))
    real = batches.bfcl_training_tasks
    leaked = official["multi_turn_base_42"]
    monkeypatch.setattr(batches, "bfcl_training_tasks", lambda *a: [*real(*a)[:3], leaked])
    res = build_tasks(lake, paths, batch_id)
    landed = lake.read("tasks", batch_id=batch_id).to_pylist()
    assert len(landed) == 3 and leaked.task_id not in {t["task_id"] for t in landed}
    assert res.metadata["contaminated_tasks"] == 1
    (q,) = [r for r in lake.read("quarantine").to_pylist() if r["batch_id"] == batch_id]
    assert "matches the benchmark item bfcl/multi_turn_base_42 (exact" in q["error"]
