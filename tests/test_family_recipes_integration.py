"""A family's recipe travels with its batch: a terminal batch run by plain `dagster job execute` (no
`tentalis` command anywhere) samples at the terminal recipe's temperature and turn limit, read back from
its rollouts. Real sandbox episodes on the tiny random model."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tentalis_pipelines.lakehouse import Lakehouse
from tentalis_pipelines.settings import Paths
from tentalis_pipelines.tasks import batches
from tentalis_pipelines.tasks.families.terminal import LEVEL0_MAX_TURNS, TERMINAL_TEMPERATURE

ROOT = Path(__file__).resolve().parents[1]
needs_sandbox = pytest.mark.skipif(not sys.platform.startswith("linux") or os.geteuid() != 0,
                                   reason="the sandbox needs Linux namespaces and root (CI runs as root)")


@needs_sandbox
def test_a_terminal_batch_run_by_dagster_job_execute_samples_at_the_terminal_recipe(tmp_path, tiny_model_dir):
    home, dh = tmp_path / "home", tmp_path / "dh"
    dh.mkdir()
    (dh / "dagster.yaml").write_text((ROOT / "dagster.yaml").read_text())
    env = {k: v for k, v in os.environ.items() if k not in ("TENTALIS_BACKEND", "OPENAI_BASE_URL")}
    env.update(TENTALIS_HOME=str(home), DAGSTER_HOME=str(dh), TENTALIS_MODEL=str(tiny_model_dir))
    paths = Paths.from_env(str(home)).ensure()
    # Registered as the nightly schedule or a sensor would: parameters only, no recipe given.
    batch_id = batches.register_terminal_batch(paths.batches, seed=1, num_tasks=2, levels=(0,))
    subprocess.run([str(Path(sys.executable).parent / "dagster"), "instance", "migrate"], env=env, capture_output=True, timeout=120)
    # The run config sets no temperature and no turn limit: the policy resource's default is 0.8.
    config = tmp_path / "run.yaml"
    config.write_text("resources:\n  policy: {config: {num_generations: 2}}\n")
    add = ("from dagster import DagsterInstance; i = DagsterInstance.get(); "
           f"i.add_dynamic_partitions('task_batches', [{batch_id!r}])")
    out = subprocess.run([sys.executable, "-c", add], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    out = subprocess.run([str(Path(sys.executable).parent / "dagster"), "job", "execute", "-m", "tentalis_pipelines.definitions",
                          "-c", str(config), "-j", "rollout_job", "--tags", json.dumps({"dagster/partition": batch_id})],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, (out.stdout[-2000:], out.stderr[-4000:])
    rollouts = Lakehouse(paths.lakehouse).read("rollouts", batch_id=batch_id).to_pylist()
    assert len({(r["task_id"], r["group_index"]) for r in rollouts}) == 4  # 2 tasks x 2 episodes
    assert {r["temperature"] for r in rollouts} == {TERMINAL_TEMPERATURE} == {0.4}
    episodes = [json.loads(r["episode"]) for r in rollouts]
    assert {e["max_turns"] for e in episodes} == {LEVEL0_MAX_TURNS} == {4}
    assert all(1 <= e["turns"] <= 4 for e in episodes)
    # The token budget per turn is the recipe's 128: no turn is longer.
    assert all(s["end"] - s["start"] <= 128 for r in rollouts for s in r["turn_spans"])
