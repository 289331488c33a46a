"""SIGKILL in every window of writing a checkpoint (mid-update, mid-save, after the rename, after the
row, mid-promote) and two trainers racing for the same fresh set: the state left behind is consistent
and loadable, and the next start reconciles it without losing trajectories or promotions.

Each crash runs in a real child process that kills itself with SIGKILL at the window (monkeypatched
inside the child; production code has no test hooks)."""

import os
import signal
import subprocess
import sys
import threading
import time
from datetime import datetime, timezone

import pytest

from tentalis_pipelines.lakehouse import Lakehouse
from tentalis_pipelines.policy import PolicySettings
from tentalis_pipelines.settings import Paths
from tentalis_pipelines.stages.training import train_checkpoint, untrained_trajectories
from tentalis_pipelines.training import checkpoints as ckpt
from tentalis_pipelines.training import serving
from tentalis_pipelines.training.trainer import GRPOConfig, build_policy

NOW = datetime.now(timezone.utc)

TRAIN = """
import os, signal, sys, time
from pathlib import Path
from tentalis_pipelines.lakehouse import Lakehouse
from tentalis_pipelines.policy import PolicySettings
from tentalis_pipelines.stages.training import train_checkpoint, untrained_trajectories
from tentalis_pipelines.settings import Paths
from tentalis_pipelines.training.trainer import GRPOConfig

home, model, window, pause = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
die = lambda: os.kill(os.getpid(), signal.SIGKILL)

if window == "mid_save":  # the adapter's files are written into the temp folder, no marker yet
    from peft import PeftModel
    save = PeftModel.save_pretrained
    PeftModel.save_pretrained = lambda self, *a, **k: (save(self, *a, **k), die())
elif window == "after_rename":  # the adapter folder is in place, its row is not written
    replace = os.replace
    os.replace = lambda a, b: (replace(a, b), Path(str(a)).name.startswith(".tmp-") and die())
elif window == "after_row":  # the checkpoint row is written, the promotion is not
    append = Lakehouse.append
    Lakehouse.append = lambda self, name, rows: (append(self, name, rows), name == "checkpoints" and die())[0]
elif window == "mid_promote":  # the serving pointer moved, checkpoints.promoted and the claim's 'done' are not written
    update = Lakehouse.update
    Lakehouse.update = lambda self, name, *a: die() if name == "checkpoints" else update(self, name, *a)

paths = Paths.from_env(home).ensure()
def on_step(rec):
    print("STEP", rec["step"], flush=True)
    time.sleep(pause)
train_checkpoint(Lakehouse(paths.lakehouse), paths, PolicySettings(model=model), GRPOConfig(per_step_rows=2),
                 promote=True, on_step=on_step)
print("DONE", flush=True)
"""


def _seed_lakehouse(home, tiny_model_dir):
    """A promoted parent checkpoint and 8 fresh trajectories it sampled."""
    paths = Paths.from_env(home).ensure()
    lake = Lakehouse(paths.lakehouse)
    parent = ckpt.save_adapter(build_policy(tiny_model_dir, None, GRPOConfig()), paths.checkpoints, "ckpt-parent")
    ckpt.record_checkpoint(lake, {"checkpoint_id": "ckpt-parent", "parent_id": None, "base_model": "tiny", "adapter_uri": str(parent),
                                  "algorithm": "grpo", "config": {}, "trained_on": [], "trajectory_ids": [], "trajectory_count": 0,
                                  "metrics": {}, "promoted": False})
    serving.promote(lake, "ckpt-parent", actor="test", reason="seed")
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


def _spawn(home, tiny_model_dir, window, pause):
    return subprocess.Popen([sys.executable, "-c", TRAIN, str(home), str(tiny_model_dir), window, str(pause)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})


def _visible(paths):
    return sorted(p.name for p in paths.checkpoints.iterdir() if not p.name.startswith("."))


def _claim_events(lake, claim_id):
    return [r["event"] for r in sorted(lake.read("training_claims").to_pylist(), key=lambda r: r["created_at"]) if r["claim_id"] == claim_id]


def _train_in_process(lake, paths, tiny_model_dir):
    res = train_checkpoint(lake, paths, PolicySettings(model=str(tiny_model_dir)), GRPOConfig(per_step_rows=4), promote=True)
    return res.metadata["checkpoint_id"]


def test_second_trainer_fails_fast_and_sigkill_mid_update_is_reconciled(home, tiny_model_dir):
    paths, lake = _seed_lakehouse(home, tiny_model_dir)
    procs = [_spawn(home, tiny_model_dir, "none", 60) for _ in range(2)]
    stepped = {p.pid: threading.Event() for p in procs}

    def watch(p):
        for line in p.stdout:
            if line.startswith("STEP"):
                stepped[p.pid].set()

    for p in procs:
        threading.Thread(target=watch, args=(p,), daemon=True).start()
    try:
        deadline = time.time() + 240
        while time.time() < deadline:
            exited = [p for p in procs if p.poll() is not None]
            training = [p for p in procs if stepped[p.pid].is_set()]
            if len(training) == 2 or (len(exited) == 1 and len(training) == 1) or len(exited) == 2:
                break
            time.sleep(0.2)
        assert len(training) < 2, "both trainers are training the same fresh set"
        assert len(exited) == 1 and len(training) == 1, "expected one trainer to fail fast and the other to train"
        loser, winner = exited[0], training[0]
        err = loser.stderr.read()
        assert loser.returncode == 1 and "TrainingClaimError" in err and f"pid {winner.pid} on" in err, err[-2000:]
        os.kill(winner.pid, signal.SIGKILL)  # between two optimizer updates
        winner.wait(timeout=30)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()

    assert serving.serving_policy(lake) == ("ckpt-parent", str(paths.checkpoints / "ckpt-parent"))
    assert [r["checkpoint_id"] for r in lake.read("checkpoints").to_pylist()] == ["ckpt-parent"]
    assert _visible(paths) == ["ckpt-parent"]
    (stale,) = ckpt.active_claims(lake)
    assert stale.pid == winner.pid and not stale.alive()

    new = _train_in_process(lake, paths, tiny_model_dir)  # the next start settles the dead holder's claim first
    assert _claim_events(lake, stale.claim_id) == ["claimed", "abandoned"]
    row = ckpt.checkpoint_row(lake, new)
    assert row["parent_id"] == "ckpt-parent" and row["trajectory_count"] == 8
    assert serving.serving_checkpoint(lake) == new and ckpt.active_claims(lake) == []


@pytest.mark.parametrize("window", ["mid_save", "after_rename", "after_row", "mid_promote"])
def test_sigkill_in_each_commit_window_is_reconciled(home, tiny_model_dir, window):
    paths, lake = _seed_lakehouse(home, tiny_model_dir)
    proc = _spawn(home, tiny_model_dir, window, 0)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == -signal.SIGKILL, err[-2000:]
    (claim,) = ckpt.active_claims(lake)
    crashed = claim.checkpoint_id
    assert not claim.alive() and claim.promote

    # What the crash left is consistent and loadable: the serving adapter verifies, nothing half-written is visible.
    served, adapter = serving.serving_policy(lake)
    ckpt.verify_adapter(adapter)
    rows = sorted(r["checkpoint_id"] for r in lake.read("checkpoints").to_pylist())
    assert served == (crashed if window == "mid_promote" else "ckpt-parent")
    assert rows == (["ckpt-parent"] if window in ("mid_save", "after_rename") else sorted(["ckpt-parent", crashed]))
    assert _visible(paths) == (["ckpt-parent"] if window == "mid_save" else sorted(["ckpt-parent", crashed]))
    if window == "mid_save":
        assert [p.name for p in paths.checkpoints.glob(".tmp-*")] and untrained_trajectories(lake, "ckpt-parent").num_rows == 8

    if window in ("mid_save", "after_rename"):
        # No row: the next start removes the leftovers, abandons the claim and trains on the same 8 trajectories.
        new = _train_in_process(lake, paths, tiny_model_dir)
        assert _claim_events(lake, claim.claim_id) == ["claimed", "abandoned"]
        assert _visible(paths) == sorted(["ckpt-parent", new]) and not list(paths.checkpoints.glob(".tmp-*"))
        assert ckpt.checkpoint_row(lake, new)["trajectory_count"] == 8 and serving.serving_checkpoint(lake) == new
        return

    report = ckpt.reconcile(lake, paths)
    assert report["claims_done"] == [claim.claim_id] and _claim_events(lake, claim.claim_id) == ["claimed", "done"]
    last = serving.serving_history(lake)[-1]
    assert last["to_checkpoint"] == crashed
    assert last["action"] == ("reconcile" if window == "after_row" else "promote")  # the intended promotion is finished
    assert ckpt.checkpoint_row(lake, crashed)["promoted"] is True
    assert untrained_trajectories(lake, "ckpt-parent").num_rows == 0  # consumed by the checkpoint that now serves
    assert ckpt.reconcile(lake, paths) == {k: [] for k in report}  # idempotent
