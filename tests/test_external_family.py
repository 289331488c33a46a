"""Bring your own agent environment (issue 71, must-hold 1): the example package
``examples/tentalis-family-example`` (the ``units`` family: a unit-conversion tool and a verifier of the
submitted number) is installed with pip into a folder of its own, found through its ``tentalis.families``
entry point, and ``tentalis learn --tasks units`` runs a learning cycle on it in a subprocess: a seeded
batch of its tasks, episodes in its environment, a checkpoint, the ``units`` benchmark (its held-out
split) for the checkpoint and the base, and the gate, on the tiny random model. The random model never
solves a task, so (as in ``test_env_batches_integration.py``) the family's verifier is replaced for
*training* episodes by one that passes the first episode of each task and fails the rest: each group
then carries a learning signal and the cycle trains. Held-out episodes keep the real verifier. No file of
``tentalis_pipelines/`` names the family (``tests/unit/test_house.py`` keeps branches on family names
out of the product)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from tentalis_pipelines.lakehouse import Lakehouse
from tentalis_pipelines.settings import Paths

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "tentalis-family-example"


def install_example(tmp_path: Path) -> Path:
    """``pip install --no-deps`` the example package into a folder (its copy, so no build output lands in
    the repository); the folder on PYTHONPATH is an installed distribution with its entry points."""
    src, site = tmp_path / "example", tmp_path / "site"
    shutil.copytree(EXAMPLE, src, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    out = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                          "--no-index", "--target", str(site), str(src)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert (site / "tentalis_family_units").is_dir()
    return site


# `tentalis` in a process of its own, with the installed family's verifier stubbed for training episodes.
DRIVER = """
import sys

from tentalis_family_units.env import UnitsEnv
from tentalis_pipelines.envs.base import Verdict

real, first = UnitsEnv.verify, {}


def verify(self):
    if self.task is None or self.task.split != "train":
        return real(self)
    passed = first.setdefault(self.task.task_id, self) is self  # the first environment (episode) of each task
    return Verdict(True, 1.0, "stub: passed") if passed else Verdict(False, 0.0, "stub: failed")


UnitsEnv.verify = verify
from tentalis_pipelines.cli import app

app()
"""


def test_an_installed_family_learns_is_benchmarked_on_its_held_out_split_and_gated(tmp_path, tiny_model_dir):
    site = install_example(tmp_path)
    home = tmp_path / "home"
    env = {k: v for k, v in os.environ.items() if k not in ("TENTALIS_BACKEND", "OPENAI_BASE_URL", "DAGSTER_HOME")}
    env.update(TENTALIS_HOME=str(home), TENTALIS_MODEL=str(tiny_model_dir), PYTHONPATH=os.pathsep.join([str(ROOT), str(site)]),
               # exact-only screening (no embedding pass): the family's held-out split is screened by its fingerprint
               TENTALIS_CONTAMINATION_BENCHMARKS="arithmetic", OMP_NUM_THREADS="1")
    driver = tmp_path / "tentalis_stubbed.py"
    driver.write_text(DRIVER)
    out = subprocess.run([sys.executable, str(driver), "learn", "--tasks", "units", "--cycles", "1",
                          "--num-tasks", "2", "--num-generations", "2", "--gate-limit", "4"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, (out.stdout[-3000:], out.stderr[-3000:])
    lake = Lakehouse(Paths.from_env(str(home)).lakehouse)

    tasks = lake.read("tasks").to_pylist()
    assert len(tasks) == 2 and {t["environment"] for t in tasks} == {"units"} and {t["source"] for t in tasks} == {"generator:units"}
    batch_id = tasks[0]["batch_id"]
    manifest = json.loads((Paths.from_env(str(home)).batches / batch_id / "manifest.json").read_text())
    assert (manifest["kind"], manifest["family"], manifest["recipe"]["temperature"]) == ("family", "units", 0.7)

    rollouts = lake.read("rollouts", batch_id=batch_id).to_pylist()
    assert len({(r["task_id"], r["group_index"]) for r in rollouts}) == 4  # 2 tasks x 2 episodes
    episodes = [json.loads(r["episode"]) for r in rollouts]
    assert {e["environment"] for e in episodes} == {"units"} and {e["max_turns"] for e in episodes} == {4}
    assert all(r["parse_mode"].startswith("episode:") and r["turn_spans"] for r in rollouts)
    assert {r["temperature"] for r in rollouts} == {0.7}  # the family's recipe, from the manifest
    reviews = lake.read("reviews", batch_id=batch_id).to_pylist()
    assert sorted(r["score"] for r in reviews) == [0.0, 0.0, 1.0, 1.0]  # one stubbed pass per task's pair
    assert all("```convert" in r["hint"] for r in reviews if r["score"] == 0)  # the family's own hints, not bash's
    trajectories = lake.read("trajectories", batch_id=batch_id).to_pylist()
    assert {r["kind"] for r in trajectories} == {"multi_turn"} and all(r["kept"] for r in trajectories)
    # the environment's own per-turn scores (info["step_score"]) or format errors land in step_scores
    assert lake.read("step_scores", batch_id=batch_id).num_rows == sum(json.loads(r["episode"])["turns"] for r in rollouts)

    (checkpoint,) = lake.read("checkpoints").to_pylist()
    results = {r["checkpoint_id"]: r for r in lake.read("benchmark_results").to_pylist() if r["benchmark"] == "units"}
    assert set(results) == {checkpoint["checkpoint_id"], "base"} and {r["n"] for r in results.values()} == {4}
    items = lake.read("benchmark_items").to_pylist()
    assert {i["item_id"].split("-l")[0] for i in items if i["benchmark"] == "units"} == {"units-held-out"}  # the held-out split only

    decisions = [d for d in lake.read("gate_decisions").to_pylist() if d["checkpoint_id"] == checkpoint["checkpoint_id"]]
    assert len(decisions) == 1 and decisions[0]["benchmark"] == "units" and decisions[0]["n_paired"] == 4
