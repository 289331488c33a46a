"""Hinted OPD through the Dagster assets on a real lakehouse: one decision row per rollout, the signal the
teacher stored is the one trajectories carry, OPD-only keeps exactly the hinted rows, and the trainer
gets w_rl * A + w_opd * signal per token."""

from __future__ import annotations

import json

import pytest
from dagster import DagsterInstance, materialize

from assets.batch_assets import reviews, rollouts, step_scores, tasks, teacher_logprobs, trajectories
from assets.resources import LakehouseResource, PolicyResource, ReviewResource, TrainerResource
from tentalis_pipelines.lakehouse import Lakehouse
from tentalis_pipelines.policy import PolicySettings
from tentalis_pipelines.settings import Paths
from tentalis_pipelines.stages import training as stage_training
from tentalis_pipelines.stages.training import train_checkpoint
from tentalis_pipelines.tasks.batches import register_file_batch
from tentalis_pipelines.training import opd


@pytest.fixture()
def batch(home, tiny_model_dir):
    paths = Paths.from_env(home).ensure()
    src = paths.inbox / "opd.jsonl"
    src.write_text("\n".join(json.dumps(r) for r in [
        {"prompt": "Ann has 2 pens and buys 3 more. How many pens does Ann have?", "reference": "5"},
        {"prompt": "What is 6*7?", "reference": "42"},
    ]) + "\n")
    batch_id = register_file_batch(paths.batches, src)
    with DagsterInstance.ephemeral() as instance:
        instance.add_dynamic_partitions("task_batches", [batch_id])
        yield paths, batch_id, instance


def _resources(home, tiny_model_dir, **trainer):
    return {"lakehouse": LakehouseResource(home=str(home)),
            "policy": PolicyResource(model=str(tiny_model_dir), num_generations=3, max_new_tokens=12, dtype="float32"),
            "review": ReviewResource(), "trainer": TrainerResource(dtype="float32", device="cpu", **trainer)}


def test_opd_rows_flow_from_the_teacher_to_the_trainer(batch, home, tiny_model_dir, monkeypatch):
    paths, batch_id, instance = batch
    res = _resources(home, tiny_model_dir, w_rl=0.0, w_opd=1.0, opd_min_effect=0.0)
    result = materialize([tasks, rollouts, step_scores, reviews, teacher_logprobs, trajectories], partition_key=batch_id,
                         instance=instance, resources=res)
    assert result.success
    lake = Lakehouse(paths.lakehouse)
    teacher = {r["rollout_id"]: r for r in lake.read("teacher_logprobs", batch_id=batch_id).to_pylist()}
    revs = {r["rollout_id"]: r for r in lake.read("reviews", batch_id=batch_id).to_pylist()}
    assert set(teacher) == set(revs) and len(teacher) == 6  # one decision per rollout
    for rid, row in teacher.items():
        assert row["hint"] == revs[rid]["hint"].strip() and row["hint_source"] == "verifier"
        assert row["decision"] == opd.screen_hint(revs[rid]["hint"], None)[0] or row["decision"] in (opd.LEAKS_ANSWER, opd.NO_EFFECT)
        if row["decision"] == opd.USED:
            assert row["teacher"] == "self:base" and row["hint_id"].startswith("h-")
            expect = [max(-1.0, min(1.0, t - s)) for t, s in zip(row["teacher_logprobs"], row["student_logprobs"])]
            assert row["opd_signal"] == pytest.approx(expect, abs=1e-9)
            assert row["signal_mean"] == pytest.approx(sum(expect) / len(expect))
        else:
            assert row["opd_signal"] is None
    used = {rid for rid, r in teacher.items() if r["decision"] == opd.USED}
    assert used, "the tiny model's garbage answers get the verifier's 'finish with <answer>' hint, which must be used"
    traj = {r["rollout_id"]: r for r in lake.read("trajectories", batch_id=batch_id).to_pylist()}
    for rid, t in traj.items():
        assert (t["w_rl"], t["w_opd"]) == (0.0, 1.0)
        # OPD only: exactly the rows with a used hint are trained on, and they carry the teacher's signal.
        assert t["kept"] == (rid in used)
        assert t["opd_signal"] == (teacher[rid]["opd_signal"] if rid in used else None)

    seen = []
    real = stage_training.train_grpo
    monkeypatch.setattr(stage_training, "train_grpo", lambda m, tok, samples, cfg, **kw: seen.extend(samples) or real(m, tok, samples, cfg, **kw))
    policy = PolicySettings(model=str(tiny_model_dir), max_new_tokens=12)
    out = train_checkpoint(lake, paths, policy, res["trainer"].config(12), promote=False)
    assert out.metadata["samples"] == len(used) == len(seen)
    signals = sorted(tuple(teacher[rid]["opd_signal"]) for rid in used)
    got = sorted(tuple(s.token_advantages) for s in seen)
    assert len(got) == len(signals)
    for g, e in zip(got, signals):  # w_rl 0: the per-token advantage is the teacher's signal
        assert list(g) == pytest.approx(list(e))
    # "Which hints did checkpoint X learn from" is one query over the lineage (README).
    con = lake.duckdb()
    taught = con.execute("select l.row_id, t.hint from lineage l join teacher_logprobs t on t.hint_id = l.row_id "
                         "where l.checkpoint_id = $c and l.kind = 'opd_hint'", {"c": out.metadata["checkpoint_id"]}).fetchall()
    con.close()
    assert sorted(taught) == sorted((teacher[rid]["hint_id"], teacher[rid]["hint"]) for rid in used)


def test_combine_adds_the_signal_to_the_rl_advantage_and_rl_only_computes_nothing(batch, home, tiny_model_dir, monkeypatch):
    paths, batch_id, instance = batch
    assets = [tasks, rollouts, step_scores, reviews, teacher_logprobs, trajectories]
    off = materialize(assets, partition_key=batch_id, instance=instance, resources=_resources(home, tiny_model_dir))
    assert off.success
    lake = Lakehouse(paths.lakehouse)
    assert lake.read("teacher_logprobs", batch_id=batch_id).num_rows == 0  # w_opd = 0: no teacher pass at all
    assert all(t["opd_signal"] is None and t["w_opd"] == 0.0 for t in lake.read("trajectories", batch_id=batch_id).to_pylist())

    res = _resources(home, tiny_model_dir, w_rl=1.0, w_opd=0.5, opd_min_effect=0.0, dynamic_sampling=False)
    assert materialize(assets, partition_key=batch_id, instance=instance, resources=res).success
    teacher = {r["rollout_id"]: r for r in lake.read("teacher_logprobs", batch_id=batch_id).to_pylist()}
    traj = {r["rollout_id"]: r for r in lake.read("trajectories", batch_id=batch_id).to_pylist()}
    seen = {}
    real = stage_training.train_grpo

    def spy(m, tok, samples, cfg, **kw):
        for s in samples:
            seen[tuple(s.completion_ids)] = s
        return real(m, tok, samples, cfg, **kw)

    monkeypatch.setattr(stage_training, "train_grpo", spy)
    policy = PolicySettings(model=str(tiny_model_dir), max_new_tokens=12)
    train_checkpoint(lake, paths, policy, res["trainer"].config(12), promote=False)
    ro = {r["rollout_id"]: r for r in lake.read("rollouts", batch_id=batch_id).to_pylist()}
    checked = 0
    for rid, t in traj.items():
        s = seen.get(tuple(ro[rid]["completion_token_ids"]))
        if s is None or not ro[rid]["completion_token_ids"]:
            continue
        sig = teacher[rid]["opd_signal"]
        expect = [t["advantage"] + 0.5 * x for x in sig] if sig is not None else [t["advantage"]] * len(s.completion_ids)
        assert s.token_advantages == pytest.approx(expect)
        checked += 1
    assert checked >= 3
