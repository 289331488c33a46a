"""Task families: each family's recipe, written into a batch's manifest at registration and read back by
the rollout stage whoever launched it; old manifests fall back to the family's recipe; the registry
finds installed families through the ``tentalis.families`` entry points."""

from __future__ import annotations

import json
import sys

import pytest

from tentalis_pipelines.policy import PolicySettings
from tentalis_pipelines.tasks import batches, families
from tentalis_pipelines.tasks.families import Recipe, batch_policy, batch_recipe, get_family, manifest_recipe


def test_each_built_in_family_has_its_recipe():
    assert set(families.families()) >= {"arithmetic", "gsm8k", "jsonl", "terminal", "bfcl", "swe"}
    assert get_family("terminal").recipe((0,)) == Recipe(temperature=0.4, max_new_tokens=128, max_turns=4)
    assert get_family("terminal").recipe((0, 1)).max_turns == 8 and get_family("terminal").recipe((2,)).max_turns == 8
    assert get_family("arithmetic").recipe((1,)) == Recipe()  # the policy resource's sampling
    assert get_family("bfcl").recipe((1,)).temperature is None and get_family("bfcl").recipe((1,)).max_turns == 8
    with pytest.raises(ValueError, match="no task family 'nope'.*tentalis.families"):
        get_family("nope")


def test_the_recipe_is_written_into_the_manifest_and_the_rollouts_sample_with_it(tmp_path):
    bid = batches.register_terminal_batch(tmp_path, seed=1, num_tasks=2, levels=(0,))
    manifest = json.loads((tmp_path / bid / "manifest.json").read_text())
    assert manifest["family"] == "terminal"
    assert manifest["recipe"] == {"temperature": 0.4, "max_new_tokens": 128, "max_turns": 4, "num_generations": None}
    assert batch_recipe(tmp_path, bid) == Recipe(temperature=0.4, max_new_tokens=128, max_turns=4)
    # The resource's defaults (temperature 0.8, 64 tokens here) give way to the batch's recipe; the rest stays.
    policy = batch_policy(tmp_path, bid, PolicySettings(max_new_tokens=64, num_generations=3, seed=7))
    assert (policy.temperature, policy.max_new_tokens, policy.num_generations, policy.seed) == (0.4, 128, 3, 7)
    # The task rows carry the recipe's turn limit.
    rows = batches.load_batch(tmp_path, bid, __import__("datetime").datetime.now()).tasks
    assert {json.loads(r["metadata"])["max_turns"] for r in rows} == {4}


def test_overrides_at_registration_go_into_the_manifest_and_unset_ones_keep_the_familys(tmp_path):
    chosen = batches.family_recipe("terminal", (1,), temperature=0.9, max_new_tokens=None, num_generations=6)
    assert chosen == Recipe(temperature=0.9, max_new_tokens=128, max_turns=8, num_generations=6)
    bid = batches.register_terminal_batch(tmp_path, seed=2, num_tasks=1, levels=(1,), recipe=chosen)
    policy = batch_policy(tmp_path, bid, PolicySettings())
    assert (policy.temperature, policy.max_new_tokens, policy.num_generations) == (0.9, 128, 6)
    with pytest.raises(ValueError, match="other parameters"):  # the same batch with another recipe is another batch
        batches.register_terminal_batch(tmp_path, seed=2, num_tasks=1, levels=(1,), batch_id=bid)
    with pytest.raises(ValueError, match="unknown recipe field"):
        batches.family_recipe("terminal", (1,), top_k=3)


def test_a_batch_without_a_recipe_in_its_manifest_falls_back_to_its_familys_recipe(tmp_path):
    """Batches registered before recipes were recorded: the family's recipe for the manifest's levels,
    with the manifest's own max_turns when it has one."""
    old = {"kind": "terminal", "source": "terminal", "seed": 3, "num_tasks": 2, "levels": [1], "max_turns": 3}
    (tmp_path / "terminal-s3-n2-l1").mkdir()
    (tmp_path / "terminal-s3-n2-l1" / "manifest.json").write_text(json.dumps(old))
    assert manifest_recipe(old) == Recipe(temperature=0.4, max_new_tokens=128, max_turns=3)
    assert batch_policy(tmp_path, "terminal-s3-n2-l1", PolicySettings()).temperature == 0.4
    # Registering the same batch again is accepted: its recorded parameters and fallback recipe agree.
    assert batches.register_terminal_batch(tmp_path, seed=3, num_tasks=2, levels=(1,), max_turns=3) == "terminal-s3-n2-l1"
    assert manifest_recipe({"kind": "terminal", "levels": [0]}).max_turns == 4
    assert manifest_recipe({"kind": "arithmetic", "seed": 1, "num_tasks": 2, "levels": [1]}) == Recipe()
    assert manifest_recipe({"kind": "jsonl", "source": "x", "file": "tasks.jsonl"}) == Recipe()
    assert manifest_recipe({"kind": "sessions"}) == Recipe()  # a kind of no family: nothing to say
    assert batch_policy(tmp_path, "never-registered", PolicySettings()).temperature == 0.8  # no manifest: the resource's


@pytest.mark.parametrize("bad", [{"temperature": 0}, {"temperature": 2.5}, {"temperature": True}, {"max_turns": 0},
                                 {"max_new_tokens": 1.5}, {"num_generations": -1}])
def test_a_recipe_out_of_range_is_refused_naming_the_field(bad):
    with pytest.raises(ValueError, match=f"recipe {next(iter(bad))}"):
        Recipe(**bad)
    with pytest.raises(ValueError, match="manifest recipe: unknown field"):
        Recipe.from_json({"temp": 0.4}, where="manifest recipe")


def test_an_installed_package_adds_a_family_through_the_entry_point_group(tmp_path, monkeypatch):
    """A real distribution on sys.path (dist-info with entry_points.txt), found by importlib.metadata."""
    (tmp_path / "acme_family.py").write_text(
        "from tentalis_pipelines.tasks.families import Recipe, TaskFamily\n"
        "class Acme(TaskFamily):\n    name = 'acme'\n    levels = (1,)\n    default_recipe = Recipe(temperature=0.6, max_turns=5)\n")
    info = tmp_path / "acme_family-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: acme-family\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[tentalis.families]\nacme = acme_family:Acme\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(families, "_registry", {})
    try:
        assert get_family("acme").recipe((1,)) == Recipe(temperature=0.6, max_turns=5)
        assert "terminal" in families.families()  # the built-in ones stay
    finally:
        sys.modules.pop("acme_family", None)


def test_an_entry_point_reusing_a_built_in_name_is_an_error_naming_it(tmp_path, monkeypatch):
    (tmp_path / "evil_family.py").write_text("from tentalis_pipelines.tasks.families import TaskFamily\n"
                                             "class Evil(TaskFamily):\n    name = 'terminal'\n")
    info = tmp_path / "evil_family-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: evil-family\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[tentalis.families]\nevil = evil_family:Evil\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(families, "_registry", {})
    try:
        with pytest.raises(RuntimeError, match="'evil'.*reuses the built-in family name 'terminal'"):
            families.families()
    finally:
        sys.modules.pop("evil_family", None)
