"""The environment family interface (issue 71): a family that is not built in (the example package's
``units``, put on the path and into the registry here) goes through the generic code paths: a seeded
``"kind": "family"`` batch, its task rows, its environment, its held-out benchmark and the contamination
guard's held-out screening, with no file of ``tentalis_pipelines/`` naming it. The end-to-end run with
the package installed by pip is ``tests/test_external_family.py``."""

from __future__ import annotations

import json
import sys
from datetime import datetime, timezone
from pathlib import Path

import pytest

from tentalis_pipelines.tasks import batches, families

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "tentalis-family-example" / "src"
NOW = datetime.now(timezone.utc)


@pytest.fixture()
def units(monkeypatch):
    """The example family in the registry, as its entry point would put it there."""
    monkeypatch.syspath_prepend(str(EXAMPLE))
    from tentalis_family_units import FAMILY

    registry = dict(families.families())
    monkeypatch.setattr(families, "_registry", {**registry, FAMILY.name: FAMILY})
    yield FAMILY
    for name in [m for m in sys.modules if m.startswith("tentalis_family_units")]:
        sys.modules.pop(name)


def test_single_turn_families_say_they_have_no_environment():
    assert families.get_family("arithmetic").environment is None
    with pytest.raises(NotImplementedError, match="'arithmetic' is single-turn"):
        families.get_family("arithmetic").make_env(4)
    # the built-in environment families make their environments through the registry
    assert {"terminal", "bfcl", "swe"} <= set(families.environment_families())
    assert families.installed_environment_families() == {} or "terminal" not in families.installed_environment_families()


def test_a_seeded_batch_of_an_installed_family_registers_and_loads_through_the_registry(tmp_path, units):
    batch_id = batches.register_family_batch(tmp_path, "units", seed=3, num_tasks=4, levels=(1, 2))
    manifest = json.loads((tmp_path / batch_id / "manifest.json").read_text())
    assert batch_id == "units-s3-n4-l12"
    assert (manifest["kind"], manifest["family"], manifest["levels"]) == ("family", "units", [1, 2])
    assert manifest["recipe"] == units.recipe((1, 2)).to_json() and manifest["recipe"]["max_turns"] == 4
    loaded = batches.load_batch(tmp_path, batch_id, NOW)
    assert [r["environment"] for r in loaded.tasks] == ["units"] * 4 and not loaded.rejects
    assert {json.loads(r["metadata"])["max_turns"] for r in loaded.tasks} == {4}
    assert [r["difficulty"] for r in loaded.tasks] == [1, 2, 1, 2]
    assert units.task_from_row(loaded.tasks[0]).task_id == loaded.tasks[0]["task_id"]
    assert batches.next_family_seed(tmp_path, "units") == 4
    # the same parameters again: the same batch; other parameters under the same id: refused
    assert batches.register_family_batch(tmp_path, "units", seed=3, num_tasks=4, levels=(1, 2)) == batch_id
    with pytest.raises(ValueError, match="already registered"):
        batches.register_family_batch(tmp_path, "units", seed=4, num_tasks=4, levels=(1, 2), batch_id=batch_id)
    with pytest.raises(ValueError, match=r"units levels must be a non-empty subset of \[1, 2\]"):
        batches.register_family_batch(tmp_path, "units", seed=3, num_tasks=4, levels=(3,))


def test_a_training_task_equal_to_a_held_out_one_is_quarantined_by_the_familys_fingerprint(tmp_path, units, monkeypatch):
    held = units.held_out_tasks()[0]
    real = units.training_tasks
    monkeypatch.setattr(type(units), "training_tasks", lambda self, seed, n, levels: [*real(seed, max(n - 1, 1), levels), held])
    batch_id = batches.register_family_batch(tmp_path, "units", seed=1, num_tasks=3, levels=(1,))
    loaded = batches.load_batch(tmp_path, batch_id, NOW)
    assert len(loaded.tasks) == 2 and len(loaded.rejects) == 1
    assert f"same task as held-out {held.task_id} of units" in loaded.rejects[0]["error"]


def test_the_environment_the_benchmark_and_the_guard_come_from_the_family(units):
    from tentalis_pipelines import contamination, env_batches
    from tentalis_pipelines.evaluation.benchmarks import is_environment_benchmark, load_benchmark

    env = env_batches.make_env("units", 3)
    assert (type(env).__name__, env.max_turns) == ("UnitsEnv", 3)
    assert "units" in env_batches.environments()
    name, items = load_benchmark("units", limit=5)
    assert name == "units" and len(items) == 5 and {it.environment for it in items} == {"units"}
    assert is_environment_benchmark("units")
    contamination.held_out_tasks.cache_clear()
    try:
        held = units.held_out_tasks()[3]
        row = units.task_row(held)
        assert contamination.held_out_reason(row) == "its split is test"
        row = {**row, "metadata": json.dumps({**json.loads(row["metadata"]), "split": "train"})}  # relabelled
        assert contamination.held_out_reason(row) == "a units held-out task id"
        # the same task under another id is still held out (the family's fingerprint)
        assert contamination.held_out_reason({**row, "task_id": "units-renamed"}) == f"the same task as held-out {held.task_id}"
        train = units.task_row(units.training_tasks(1, 1, (1,))[0])
        assert contamination.held_out_reason(train) is None
    finally:
        contamination.held_out_tasks.cache_clear()


def test_the_cli_takes_an_installed_family_as_a_task_source(units):
    from tentalis_pipelines.cli.common import parse_levels
    from tentalis_pipelines.cli.cycle import check_seeded_source, held_out_benchmark

    check_seeded_source("units")  # no exit
    assert held_out_benchmark("units", (1,)) == "units"
    assert parse_levels("1,2", "units") == [1, 2]


def test_a_cycle_resumes_an_installed_familys_batch_left_without_trajectories(tmp_path, units):
    first = batches.register_family_batch(tmp_path, "units", seed=1, num_tasks=2, levels=(1,))
    resumed = batches.interrupted_cycle_batch(tmp_path, task_source="units", num_tasks=2, levels=(1,), settled=set())
    assert resumed == first
    assert batches.interrupted_cycle_batch(tmp_path, task_source="units", num_tasks=2, levels=(1,), settled={first}) is None


def test_the_verifier_review_speaks_the_familys_words(units):
    from tentalis_pipelines.envs.verdicts import verdict_review

    fields = {"passed": False, "reward": 0.0, "detail": "", "end_reason": "turn_limit", "check_kind": "answer", "format_errors": 4,
              "turns": 4, "max_turns": 4}
    assert "```bash" in verdict_review(**fields)["hint"]  # the generic (terminal) wording
    assert verdict_review(**fields, family_hints=units.hints)["hint"] == units.hints["format"]
