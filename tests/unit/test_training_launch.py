"""The launch part of the checkpoints stage and the external entry point, without training a model: the job
the stage hands its launcher (by hand), what a failed launch leaves (nothing under its checkpoint id), the
idle window's refusal of an external launcher, and what ``pipes_entry`` reports back through Dagster Pipes."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest

from tentalis_pipelines import lineage
from tentalis_pipelines.lakehouse import Lakehouse, now_utc
from tentalis_pipelines.policy import PolicySettings
from tentalis_pipelines.settings import Paths
from tentalis_pipelines.stages.training import train_checkpoint
from tentalis_pipelines.training import checkpoints as ckpt
from tentalis_pipelines.training import launchers, serving
from tentalis_pipelines.training.trainer import GRPOConfig


class Failing:
    """A launcher that records the job, leaves what a run killed mid-save leaves (a temporary folder and
    the renamed adapter folder), and fails."""

    name = "failing"

    def __init__(self):
        self.jobs = []

    def launch(self, job, on_step=None):
        self.jobs.append(job)
        root = Path(job.checkpoints)
        for name in (f".tmp-{job.checkpoint_id}-77@host", job.checkpoint_id):
            (root / name).mkdir(parents=True)
            (root / name / "adapter_model.safetensors").write_text("half")
        raise RuntimeError("the job was killed")


def _serving_c1(home) -> tuple[Lakehouse, Paths, Path]:
    """c1 (trained from the base) serves; two kept trajectories of c1 in batch b1, in reverse training order."""
    paths = Paths.from_env(home).ensure()
    lake = Lakehouse(paths.lakehouse)
    folder = paths.checkpoints / "c1"
    folder.mkdir(parents=True)
    (folder / ckpt.MARKER).write_text(json.dumps({"files": []}))
    lake.append("checkpoints", [{"checkpoint_id": "c1", "parent_id": None, "base_model": "m", "adapter_uri": str(folder),
                                 "algorithm": "grpo", "config": "{}", "trained_on": [], "trajectory_ids": [], "trajectory_count": 0,
                                 "metrics": "{}", "promoted": False, "created_at": now_utc() - timedelta(minutes=5)}])
    serving.promote(lake, "c1", actor="test", reason="serve c1")
    t = now_utc()
    lake.write_batch("trajectories", "b1", [{"batch_id": "b1", "rollout_id": rid, "task_id": "t", "group_index": gi,
                                             "policy_version": "c1", "advantage": adv, "kept": True, "created_at": t}
                                            for rid, gi, adv in (("r-b", 1, -1.0), ("r-a", 0, 1.0))])
    return lake, paths, folder


def test_the_stage_hands_its_launcher_the_pinned_job_and_a_failed_launch_leaves_nothing(home):
    lake, paths, c1 = _serving_c1(home)
    (paths.checkpoints / "ckpt-other").mkdir()  # another checkpoint's folder: never touched
    pinned = lineage.table_versions(lake)
    launcher = Failing()
    with pytest.raises(RuntimeError, match="the job was killed"):
        train_checkpoint(lake, paths, PolicySettings(model="embedded", max_new_tokens=77), GRPOConfig(per_step_rows=2, beta=0.0),
                         promote=False, launcher=launcher)
    [job] = launcher.jobs
    # The job, by hand: the serving checkpoint is the parent, rows in training order (group index), the
    # versions pinned before reading, the completion limit from the policy.
    assert job.policy_version == "c1" and job.parent_adapter == str(c1)
    assert job.trajectory_ids == ["r-a", "r-b"]
    assert job.versions == pinned and job.versions["trajectories"] is not None
    assert job.config["max_completion_length"] == 77 and job.config["per_step_rows"] == 2
    assert (job.checkpoints, job.lakehouse, job.model) == (str(paths.checkpoints), str(lake.root), "embedded")
    assert launchers.TrainingJob.from_dict(json.loads(json.dumps(job.to_dict()))) == job
    # Nothing is left under the failed checkpoint's id; the other folders stay; the claim is given up.
    assert sorted(p.name for p in paths.checkpoints.iterdir()) == ["c1", "ckpt-other"]
    assert ckpt.active_claims(lake) == []
    assert [r["checkpoint_id"] for r in lake.read("checkpoints").to_pylist()] == ["c1"]


class _Window:
    def pin(self, lake, version, versions, fresh, refused):
        return versions, fresh


def test_an_idle_window_refuses_an_external_launcher_and_leaves_nothing(home):
    lake, paths, _ = _serving_c1(home)
    launcher = Failing()
    launcher.name = "ray"
    with pytest.raises(ValueError, match="an idle window trains in process .* not through the 'ray' launcher"):
        train_checkpoint(lake, paths, PolicySettings(model="embedded"), GRPOConfig(), promote=False, launcher=launcher,
                         window=_Window())
    assert launcher.jobs == [] and sorted(p.name for p in paths.checkpoints.iterdir()) == ["c1"]
    assert ckpt.active_claims(lake) == []


def test_the_pipes_entry_streams_each_update_and_reports_its_adapter(tmp_path, monkeypatch):
    """``pipes_entry.main`` in this process, inside a Pipes session built from the same environment
    variables Dagster sets; the training it calls is replaced (the Ray and subprocess tests train for real)."""
    from dagster_pipes import DAGSTER_PIPES_CONTEXT_ENV_VAR, DAGSTER_PIPES_MESSAGES_ENV_VAR, encode_param

    from tentalis_pipelines.stages import pipes_entry
    from tentalis_pipelines.stages import training as stage

    job = launchers.TrainingJob(lakehouse="/h/l", checkpoints=str(tmp_path), models="/h/m", checkpoint_id="ckpt-9", policy_version="c1",
                                parent_adapter=None, versions={"trajectories": 4}, trajectory_ids=["r1", "r2", "r3"], model="embedded",
                                base_model="m", config={"beta": 0.0})
    context = {"asset_keys": None, "code_version_by_asset_key": None, "provenance_by_asset_key": None, "partition_key": None,
               "partition_key_range": None, "partition_time_window": None, "run_id": "run-1", "job_name": None, "retry_number": 0,
               "extras": {launchers.JOB_EXTRA: job.to_dict()}}
    messages = tmp_path / "messages.jsonl"
    monkeypatch.setenv(DAGSTER_PIPES_CONTEXT_ENV_VAR, encode_param({"data": context}))
    monkeypatch.setenv(DAGSTER_PIPES_MESSAGES_ENV_VAR, encode_param({"path": str(messages)}))
    seen = []

    def fake_training(got, on_step=None, progress=None):
        seen.append(got)
        for step, loss in ((0, 0.5), (1, 0.25)):
            on_step({"step": step, "loss": loss, "kl": 0.001})
        return launchers.TrainingOutput(str(tmp_path / "ckpt-9"), {"loss": 0.375, "optimizer_steps": 2, "device": "cpu",
                                                                   "guided_log_ratio": None, "ok": True}, {"checkpoint_id": "ckpt-9"})

    monkeypatch.setattr(stage, "run_training", fake_training)
    pipes_entry.main()
    assert seen == [job]
    sent = [json.loads(line) for line in messages.read_text().splitlines()]
    logs = [m["params"]["message"] for m in sent if m["method"] == "log"]
    assert "training ckpt-9 on 3 trajectories of c1" in logs
    assert "update 0: loss=0.5000 kl=0.00100" in logs and "update 1: loss=0.2500 kl=0.00100" in logs
    [report] = [m["params"]["payload"] for m in sent if m["method"] == "report_custom_message"]
    # Numbers only (no strings, None or bools): the message stays one short line.
    assert report == {"adapter_path": str(tmp_path / "ckpt-9"), "metrics": {"loss": 0.375, "optimizer_steps": 2}}
