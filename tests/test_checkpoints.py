"""Checkpoints are written atomically: a crash never leaves a half checkpoint that looks valid, other
writers' temporary folders survive, and reconcile settles what dead runs left."""

import json
import os
import socket
import subprocess
import time
from datetime import datetime, timezone

import pytest
import torch

from tentalis_pipelines.lakehouse import Lakehouse
from tentalis_pipelines.settings import Paths
from tentalis_pipelines.training import checkpoints as ckpt
from tentalis_pipelines.training import serving
from tentalis_pipelines.training.trainer import GRPOConfig, build_policy


def _row(cid, path, **kw):
    return {"checkpoint_id": cid, "parent_id": None, "base_model": "tiny", "adapter_uri": str(path), "algorithm": "grpo", "config": {},
            "trained_on": ["b"], "trajectory_ids": ["r"], "trajectory_count": 1, "metrics": {}, "promoted": False, **kw}


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_crash_during_save_leaves_nothing_visible(tmp_path, tiny_model_dir):
    model = build_policy(tiny_model_dir, None, GRPOConfig())
    lake = Lakehouse(tmp_path / "lh")
    good = ckpt.save_adapter(model, tmp_path / "ck", "ckpt-good")
    ckpt.record_checkpoint(lake, _row("ckpt-good", good))
    serving.promote(lake, "ckpt-good", actor="test", reason="first")

    original = model.save_pretrained

    def crashing_save(path, **kw):
        original(path, **kw)
        raise KeyboardInterrupt("killed mid-save")

    model.save_pretrained = crashing_save
    with pytest.raises(KeyboardInterrupt):
        ckpt.save_adapter(model, tmp_path / "ck", "ckpt-bad")
    assert not (tmp_path / "ck" / "ckpt-bad").exists()
    assert serving.serving_policy(lake) == ("ckpt-good", str(good))
    # A failure in this process removes its own temporary folder (a SIGKILL's is removed by the next save).
    assert not list((tmp_path / "ck").glob(".tmp-*"))


def test_save_removes_only_temp_folders_of_dead_writers(tmp_path, tiny_model_dir):
    model = build_policy(tiny_model_dir, None, GRPOConfig())
    root = tmp_path / "ck"
    root.mkdir()
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        live = root / f".tmp-ckpt-other-{sleeper.pid}@{socket.gethostname()}"
        dead = root / f".tmp-ckpt-gone-{_dead_pid()}@{socket.gethostname()}"
        legacy_dead = root / f".tmp-ckpt-old-{_dead_pid()}"
        for d in (live, dead, legacy_dead):
            d.mkdir()
            (d / "adapter_model.safetensors").write_bytes(b"partial")
        ckpt.save_adapter(model, root, "ckpt-new")
        assert live.exists(), "a live writer's temporary folder was deleted under it"
        assert not dead.exists() and not legacy_dead.exists()
    finally:
        sleeper.kill()
        sleeper.wait()


def test_extra_files_land_with_the_adapter_and_the_parent_folder_is_synced(tmp_path, tiny_model_dir, monkeypatch):
    model = build_policy(tiny_model_dir, None, GRPOConfig())
    events = []
    real_replace, real_fsync_dir = os.replace, ckpt.fsync_dir
    monkeypatch.setattr(ckpt.os, "replace", lambda a, b: (events.append(("replace", str(b))), real_replace(a, b))[1])
    monkeypatch.setattr(ckpt, "fsync_dir", lambda p: (events.append(("fsync_dir", str(p))), real_fsync_dir(p))[1])

    def write_state(tmp):
        assert not (tmp / ckpt.MARKER).exists()
        (tmp / "optimizer.pt").write_bytes(b"state")

    path = ckpt.save_adapter(model, tmp_path / "ck", "ckpt-a", extra=write_state)
    assert "optimizer.pt" in json.loads((path / ckpt.MARKER).read_text())["files"]
    ckpt.verify_adapter(path)
    replaced = events.index(("replace", str(path)))
    assert ("fsync_dir", str(tmp_path / "ck")) in events[replaced:], "the rename was not made durable (no parent fsync)"

    def failing(tmp):
        raise OSError("disk full")

    with pytest.raises(OSError):
        ckpt.save_adapter(model, tmp_path / "ck", "ckpt-b", extra=failing)
    assert not (tmp_path / "ck" / "ckpt-b").exists() and not list((tmp_path / "ck").glob(".tmp-*"))


def test_saved_adapter_loads_with_same_weights(tmp_path, tiny_model_dir):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = build_policy(tiny_model_dir, None, GRPOConfig(dtype="float32"))  # the reload below is fp32
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.add_(0.01)
    path = ckpt.save_adapter(model, tmp_path / "ck", "ckpt-a")
    loaded = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model_dir), str(ckpt.verify_adapter(path)))
    x = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        assert torch.allclose(model(input_ids=x).logits, loaded(input_ids=x).logits, atol=1e-5)


def test_reconcile_removes_old_orphan_folders_only(home, tiny_model_dir):
    paths = Paths.from_env(home).ensure()
    lake = Lakehouse(paths.lakehouse)
    model = build_policy(tiny_model_dir, None, GRPOConfig())
    kept = ckpt.save_adapter(model, paths.checkpoints, "ckpt-kept")
    ckpt.record_checkpoint(lake, _row("ckpt-kept", kept))
    old = ckpt.save_adapter(model, paths.checkpoints, "ckpt-orphan")
    young = ckpt.save_adapter(model, paths.checkpoints, "ckpt-young")
    os.utime(old, (time.time() - 2 * ckpt.ORPHAN_GRACE_S,) * 2)
    (paths.checkpoints / "notes").mkdir()  # not an adapter: never touched
    report = ckpt.reconcile(lake, paths)
    assert report["orphans_removed"] == ["ckpt-orphan"]
    assert kept.exists() and young.exists() and not old.exists() and (paths.checkpoints / "notes").exists()


def test_abandoned_promotion_makes_the_trajectories_fresh_again(home, tiny_model_dir):
    """A run that recorded its checkpoint and died before promoting, while someone else moved serving:
    reconcile abandons the promotion explicitly and the trajectories count as fresh again."""
    from tentalis_pipelines.stages.training import untrained_trajectories

    paths = Paths.from_env(home).ensure()
    lake = Lakehouse(paths.lakehouse)
    model = build_policy(tiny_model_dir, None, GRPOConfig())
    now = datetime.now(timezone.utc)
    lake.write_batch("trajectories", "b1", [
        {"batch_id": "b1", "rollout_id": f"r{i}", "task_id": "t", "group_index": i, "policy_version": "base", "outcome_reward": 1.0,
         "format_reward": 0.0, "process_reward": None, "step_rewards": [], "manager_score": 0.0, "overlong_penalty": 0.0, "reward": 1.0,
         "reward_weights": "{}", "advantage": 0.0, "step_advantages": [], "advantage_mode": "outcome", "kept": True, "created_at": now}
        for i in range(4)])
    other = ckpt.save_adapter(model, paths.checkpoints, "ckpt-other")
    ckpt.record_checkpoint(lake, _row("ckpt-other", other, trajectory_ids=[]))
    crashed = ckpt.save_adapter(model, paths.checkpoints, "ckpt-crashed")
    ckpt.record_checkpoint(lake, _row("ckpt-crashed", crashed, trajectory_ids=[f"r{i}" for i in range(4)], trajectory_count=4))
    lake.append("training_claims", [{"claim_id": "claim-x", "event": "claimed", "policy_version": "base", "checkpoint_id": "ckpt-crashed",
                                     "promote": True, "trajectory_count": 4, "host": socket.gethostname(), "pid": _dead_pid(),
                                     "pid_start": None, "thread": 1, "run": "test", "reason": "", "created_at": now}])
    assert untrained_trajectories(lake, "base").num_rows == 0
    serving.promote(lake, "ckpt-other", actor="alice", reason="moved while the trainer was dead")
    report = ckpt.reconcile(lake, paths)
    assert report["claims_abandoned"] == ["claim-x"]
    assert serving.serving_checkpoint(lake) == "ckpt-other"  # a human's choice is never overridden
    assert untrained_trajectories(lake, "base").num_rows == 4
    assert ckpt.active_claims(lake) == []
