"""A training run killed with SIGKILL mid-update leaves the promoted checkpoint serving and loadable,
no half-written checkpoint, and the next run trains cleanly."""

import json
import os
import signal
import subprocess
import sys
import time
from datetime import datetime, timezone

from tentalis_pipelines.lakehouse import Lakehouse
from tentalis_pipelines.settings import Paths
from tentalis_pipelines.training import checkpoints as ckpt
from tentalis_pipelines.training.trainer import GRPOConfig, build_policy

NOW = datetime.now(timezone.utc)

TRAIN = """
import sys, time
from tentalis_pipelines.lakehouse import Lakehouse
from tentalis_pipelines.pipeline import PolicySettings, train_checkpoint
from tentalis_pipelines.settings import Paths
from tentalis_pipelines.training.trainer import GRPOConfig

paths = Paths.from_env(sys.argv[1]).ensure()
def on_step(rec):
    print("STEP", rec["step"], flush=True)
    time.sleep(float(sys.argv[3]))
train_checkpoint(Lakehouse(paths.lakehouse), paths, PolicySettings(model=sys.argv[2]), GRPOConfig(per_step_rows=2),
                 promote=True, on_step=on_step)
print("DONE", flush=True)
"""


def _seed_lakehouse(home, tiny_model_dir):
    paths = Paths.from_env(home).ensure()
    lake = Lakehouse(paths.lakehouse)
    parent = ckpt.save_adapter(build_policy(tiny_model_dir, None, GRPOConfig()), paths.checkpoints, "ckpt-parent")
    ckpt.record_checkpoint(lake, {"checkpoint_id": "ckpt-parent", "parent_id": None, "base_model": "tiny", "adapter_uri": str(parent),
                                  "algorithm": "grpo", "config": {}, "trained_on": [], "trajectory_ids": [], "trajectory_count": 0,
                                  "metrics": {}, "promoted": True})
    rollouts, trajs = [], []
    for i in range(8):
        rid = f"r{i}"
        rollouts.append({"batch_id": "b1", "rollout_id": rid, "task_id": f"t{i // 4}", "group_index": i % 4,
                         "policy_version": "ckpt-parent", "backend": "transformers", "model": "tiny", "prompt_text": "What is 2+2?",
                         "completion": "x", "steps": [], "answer": None, "parse_mode": "fallback", "prompt_tokens": 5,
                         "completion_tokens": 6, "completion_token_ids": [10 + i, 11, 12, 13, 14, 15], "sampling_logprobs": None,
                         "finish_reason": "stop", "temperature": 0.8, "seconds": 0.1, "created_at": NOW})
        trajs.append({"batch_id": "b1", "rollout_id": rid, "task_id": f"t{i // 4}", "group_index": i % 4, "policy_version": "ckpt-parent",
                      "outcome_reward": float(i % 2), "format_reward": 0.0, "process_reward": None, "step_rewards": [],
                      "manager_score": 0.0, "overlong_penalty": 0.0, "reward": float(i % 2), "reward_weights": "{}",
                      "advantage": 1.0 if i % 2 else -1.0, "step_advantages": [], "advantage_mode": "outcome", "kept": True, "created_at": NOW})
    lake.write_batch("rollouts", "b1", rollouts)
    lake.write_batch("trajectories", "b1", trajs)
    return paths, lake


def test_sigkill_mid_update_keeps_the_promoted_checkpoint(home, tiny_model_dir):
    paths, lake = _seed_lakehouse(home, tiny_model_dir)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-c", TRAIN, str(home), str(tiny_model_dir), "30"], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, env=env)
    deadline = time.time() + 240
    line = ""
    while time.time() < deadline and not line.startswith("STEP"):
        line = proc.stdout.readline()
    assert line.startswith("STEP"), "training never reached its first update"
    os.kill(proc.pid, signal.SIGKILL)  # between two optimizer updates of the same run
    proc.wait(timeout=30)

    assert ckpt.latest_promoted(lake)["checkpoint_id"] == "ckpt-parent"
    ckpt.verify_adapter(ckpt.latest_promoted(lake)["adapter_uri"])
    assert [r["checkpoint_id"] for r in lake.read("checkpoints").to_pylist()] == ["ckpt-parent"]
    visible = [p.name for p in paths.checkpoints.iterdir() if not p.name.startswith(".")]
    assert visible == ["ckpt-parent"]

    done = subprocess.run([sys.executable, "-c", TRAIN, str(home), str(tiny_model_dir), "0"], capture_output=True, text=True,
                          env=env, timeout=300)
    assert "DONE" in done.stdout, done.stderr[-2000:]
    rows = {r["checkpoint_id"]: r for r in lake.read("checkpoints").to_pylist()}
    new = [r for c, r in rows.items() if c != "ckpt-parent"]
    assert len(new) == 1 and new[0]["parent_id"] == "ckpt-parent" and new[0]["trajectory_count"] == 8
    assert ckpt.latest_promoted(lake)["checkpoint_id"] == new[0]["checkpoint_id"]
    assert json.loads(new[0]["metrics"])["optimizer_steps"] == 4
