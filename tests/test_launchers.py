"""The training launchers (training/launchers.py) through the real `checkpoints` asset: the same cycle
trained in-process, in a Dagster Pipes subprocess and as a Ray job on a real local Ray cluster gives the
same adapter and the same lineage; a Ray job killed mid-run leaves no half checkpoint and frees the gpu slot."""

from __future__ import annotations

import json
import shutil
import sys
import threading
import time
from pathlib import Path

import pytest
from local_servers import RayCluster, ServerUnavailable, skip_unavailable

from assets import launchers as dagster_launchers
from assets.resources import LakehouseResource, PolicyResource, TrainerResource
from tentalis_pipelines.lakehouse import Lakehouse, now_utc
from tentalis_pipelines.settings import Paths
from tentalis_pipelines.training import launchers

# Two groups of four: rewarded answers over unrewarded ones, so every group carries a learning signal.
GROUPS = {"t0": ("What is 2 + 3?", [(" <answer>5</answer>", 1.0, 1.3), (" 7", 0.0, -0.7), (" <answer>6</answer>", 0.0, -0.7), (" five", 0.2, 0.1)]),
          "t1": ("What is 4 * 2?", [(" <answer>8</answer>", 1.0, 1.2), (" 6", 0.0, -0.4), (" <answer>9</answer>", 0.0, -0.4), (" 42", 0.0, -0.4)])}


def write_cycle(lake: Lakehouse, tok, batch_id: str = "b1") -> None:
    """One batch's rollouts and trajectories of the base policy (what `make run`'s first cycle trains on)."""
    now = now_utc()
    rollouts, trajectories = [], []
    for task_id, (prompt, answers) in GROUPS.items():
        for i, (text, reward, adv) in enumerate(answers):
            rid = f"{batch_id}-{task_id}-r{i}"
            ids = tok(text, add_special_tokens=False)["input_ids"]
            rollouts.append({
                "batch_id": batch_id, "rollout_id": rid, "task_id": task_id, "group_index": i, "policy_version": "base",
                "backend": "transformers", "model": "tiny", "prompt_text": prompt, "completion": text, "steps": [], "answer": None,
                "parse_mode": "fallback", "prompt_tokens": 5, "completion_tokens": len(ids), "completion_token_ids": ids,
                "sampling_logprobs": [-1.0] * len(ids), "finish_reason": "stop", "temperature": 0.8, "seconds": 0.1, "created_at": now,
            })
            trajectories.append({
                "batch_id": batch_id, "rollout_id": rid, "task_id": task_id, "group_index": i, "policy_version": "base",
                "outcome_reward": reward, "format_reward": 0.0, "process_reward": None, "step_rewards": [], "manager_score": reward,
                "overlong_penalty": 0.0, "reward": reward, "reward_weights": "{}", "advantage": adv, "step_advantages": [],
                "advantage_mode": "outcome", "kept": True, "created_at": now,
            })
    lake.write_batch("rollouts", batch_id, rollouts)
    lake.write_batch("trajectories", batch_id, trajectories)


@pytest.fixture()
def cycle_home(home, tiny_model_dir) -> Path:
    from transformers import AutoTokenizer

    paths = Paths.from_env(home).ensure()
    write_cycle(Lakehouse(paths.lakehouse), AutoTokenizer.from_pretrained(tiny_model_dir))
    return home


@pytest.fixture(scope="module")
def ray_cluster():
    """A real local Ray cluster for the module (its job API at ``.address``); a cluster that died meanwhile
    fails the teardown with its log."""
    try:
        cluster = RayCluster().start()
    except ServerUnavailable as exc:
        skip_unavailable("a local Ray cluster", exc)
    try:
        yield cluster
    finally:
        death = cluster.died()
        cluster.stop()
        assert death is None, f"the Ray cluster died during the tests: {death}"


def _trainer(**kw) -> TrainerResource:
    return TrainerResource(beta=0.04, per_step_rows=4, dtype="float32", device="cpu", promotion="always", **kw)


def _materialize(home: Path, tiny_model_dir: Path, trainer: TrainerResource, instance, **kw):
    from dagster import materialize

    from assets.training_assets import checkpoints

    resources = {"lakehouse": LakehouseResource(home=str(home)), "trainer": trainer,
                 "policy": PolicyResource(model=str(tiny_model_dir), max_new_tokens=16)}
    return materialize([checkpoints], instance=instance, resources=resources, **kw)


def _adapter(folder: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(folder / "adapter_model.safetensors"))


def _comparable(manifest: dict) -> dict:
    """A manifest less what names the run itself (its id and the time it was written)."""
    return {k: v for k, v in manifest.items() if k not in ("checkpoint_id", "created_at")}


def test_in_process_subprocess_and_ray_launchers_train_the_same_adapter_and_lineage(cycle_home, tiny_model_dir, tmp_path, ray_cluster):
    from dagster import DagsterInstance

    homes = {}
    for name in launchers.LAUNCHERS[:3]:
        homes[name] = tmp_path / f"home-{name}"
        shutil.copytree(cycle_home, homes[name])
    out = {}
    for name, h in homes.items():
        extra = {"ray_address": ray_cluster.address, "ray_python": sys.executable} if name == "ray" else {}
        with DagsterInstance.ephemeral() as instance:
            res = _materialize(h, tiny_model_dir, _trainer(launcher=name, **extra), instance)
            logs = [e.user_message for e in instance.all_logs(res.run_id)]
        assert res.success
        lake = Lakehouse(Paths.from_env(h).lakehouse)
        (row,) = lake.read("checkpoints").to_pylist()
        manifest = json.loads(next(r["detail"] for r in lake.read("lineage").to_pylist() if r["kind"] == "manifest"))
        assert manifest["checkpoint_id"] == row["checkpoint_id"] and row["trajectory_count"] == 8
        assert json.loads((Path(row["adapter_uri"]) / "lineage.json").read_text()) == manifest
        out[name] = (_adapter(Path(row["adapter_uri"])), manifest, json.loads(row["metrics"]), row)
        # Wherever it trained, each update's line reached the Dagster run's log (Pipes streams the external ones).
        assert any(m.startswith("update 1: loss=") for m in logs), (name, logs[-10:])
        external = any(m.startswith(f"training {row['checkpoint_id']} on 8 trajectories") for m in logs)  # pipes_entry's line
        assert external == (name != "in_process"), name
        assert any(m.startswith("[pipes] Ray job") for m in logs) == (name == "ray"), name
        mats = res.asset_materializations_for_node("checkpoints")
        assert mats and mats[0].metadata["checkpoint_id"].value == row["checkpoint_id"]

    ref_weights, ref_manifest, ref_metrics, _ = out["in_process"]
    assert len(ref_weights) > 0 and ref_manifest["samples"] == 8 and len(ref_manifest["trajectories"]) == 8
    for name in ("subprocess", "ray"):
        weights, manifest, metrics, row = out[name]
        assert set(weights) == set(ref_weights)
        worst = max((weights[k] - ref_weights[k]).abs().max().item() for k in weights)
        assert worst <= 1e-6, f"{name}: adapter differs from in-process by {worst}"
        assert _comparable(manifest) == _comparable(ref_manifest), name
        assert metrics["loss"] == pytest.approx(ref_metrics["loss"], abs=1e-6), name
        assert row["parent_id"] is None and row["promoted"] in (True, False)
    # The adapter actually moved off its initialisation: LoRA's B matrices start at zero.
    assert any(v.abs().max().item() > 0 for k, v in ref_weights.items() if "lora_B" in k)


def _gpu_slots(instance) -> list:
    return instance.event_log_storage.get_concurrency_info("gpu").claimed_slots


def test_a_ray_job_killed_mid_run_leaves_no_half_checkpoint_and_frees_the_gpu_slot(cycle_home, tiny_model_dir, ray_cluster):
    from dagster import instance_for_test
    from ray.job_submission import JobStatus, JobSubmissionClient

    client = JobSubmissionClient(ray_cluster.address)
    paths = Paths.from_env(cycle_home)
    lake = Lakehouse(paths.lakehouse)
    long_run = _trainer(launcher="ray", ray_address=ray_cluster.address, ray_python=sys.executable, num_iterations=400)
    with instance_for_test(overrides={"concurrency": {"pools": {"default_limit": 1}}}) as instance:
        box = {}
        runner = threading.Thread(target=lambda: box.setdefault("res", _materialize(cycle_home, tiny_model_dir, long_run, instance,
                                                                                 raise_on_error=False)))
        runner.start()
        killed, deadline = None, time.monotonic() + 240
        while killed is None and time.monotonic() < deadline and runner.is_alive():
            for job in client.list_jobs():
                if (job.submission_id or "").startswith("tentalis-") and job.status == JobStatus.RUNNING \
                        and "update 3:" in client.get_job_logs(job.submission_id):
                    assert _gpu_slots(instance), "the training step should hold the gpu slot while it runs"
                    client.stop_job(job.submission_id)  # the kill, from outside, mid-update
                    killed = job.submission_id
            time.sleep(0.3)
        runner.join(timeout=180)
        assert killed, "the Ray job never reached its third update"
        res = box["res"]
        assert not res.success
        assert client.get_job_status(killed) in (JobStatus.STOPPED, JobStatus.FAILED)
        assert _gpu_slots(instance) == []  # the slot is free again
        # No half checkpoint: no adapter folder, no temporary folder, no row, no lineage; the claim is abandoned.
        assert not paths.checkpoints.exists() or sorted(p.name for p in paths.checkpoints.iterdir()) == []
        assert not lake.exists("checkpoints") or lake.count("checkpoints") == 0
        assert not lake.exists("lineage") or lake.count("lineage") == 0
        events = [r["event"] for r in sorted(lake.read("training_claims").to_pylist(), key=lambda r: r["created_at"])]
        assert events == ["claimed", "abandoned"]
        # The trajectories are fresh again: the next run (in-process) trains on all eight.
        again = _materialize(cycle_home, tiny_model_dir, _trainer(), instance)
        assert again.success and lake.count("checkpoints") == 1
        assert lake.read("checkpoints").to_pylist()[0]["trajectory_count"] == 8


# A Pipes run that sends messages while it runs (Ray's log stream delivers them live) and more right before it
# exits (the stream has not delivered those when the job ends: the reader reads them from the finished log).
CHATTY_RUN = """
import time
from dagster_pipes import open_dagster_pipes
with open_dagster_pipes() as pipes:
    for i in range(60):
        pipes.report_custom_message({"seq": i})
    time.sleep(3)
    for i in range(60, 120):
        pipes.report_custom_message({"seq": i})
    print("a plain line the run printed")
"""


def test_the_ray_reader_hands_over_every_message_once_in_order_without_waiting_for_rays_stream(tmp_path, ray_cluster):
    """`closing_ray_reader` stops following Ray's log stream when the job ends and reads the rest of the
    finished log: every message the run sent arrives exactly once, in order (dagster-ray's own reader waits
    seconds for Ray to close the stream)."""
    from dagster import DagsterInstance, asset, materialize
    from dagster_ray import PipesRayJobClient

    script = tmp_path / "chatty.py"
    script.write_text(CHATTY_RUN)
    got = {}

    @asset
    def chatty(context):
        client = PipesRayJobClient(address=ray_cluster.address, poll_interval=0.25, message_reader=dagster_launchers.closing_ray_reader())
        invocation = client.run(context=context, submit_job_params={"entrypoint": f"{sys.executable} {script}"})
        got["seq"] = [m["seq"] for m in invocation.get_custom_messages()]
        return invocation.get_results()

    with DagsterInstance.ephemeral() as instance:
        assert materialize([chatty], instance=instance).success
    assert got["seq"] == list(range(120))
