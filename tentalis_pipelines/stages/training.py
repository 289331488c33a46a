"""The `checkpoints` stage: a LoRA checkpoint trained on the serving policy's fresh trajectories."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tentalis_pipelines import lineage
from tentalis_pipelines.inference.models import resolve_model
from tentalis_pipelines.lakehouse import Lakehouse
from tentalis_pipelines.policy import PolicySettings
from tentalis_pipelines.settings import Paths
from tentalis_pipelines.stages.common import StageResult, markdown_table
from tentalis_pipelines.stages.rollouts import current_policy
from tentalis_pipelines.training import checkpoints as ckpt
from tentalis_pipelines.training import launchers, serving
from tentalis_pipelines.training.policy_lag import checkpoint_parents, policy_lags, split_by_lag
from tentalis_pipelines.training.samples import build_training_samples
from tentalis_pipelines.training.trainer import (
    GRPOConfig,
    build_policy,
    load_trainer_state,
    save_trainer_state,
    train_grpo,
)

FRESH_SQL = """
select t.* from trajectories t
where t.kept and t.policy_version = $policy
  and t.rollout_id not in (""" + ckpt.CONSUMED_SQL + """)
"""


def untrained_trajectories(lake: Lakehouse, policy_version: str, versions: dict[str, int | None] | None = None):
    """Trajectories sampled by the serving policy that no checkpoint has trained on yet (``versions``:
    the trajectories table as of a pinned Delta version, see ``lineage``)."""
    con = lake.duckdb(["trajectories", "checkpoints", "training_claims"],
                      versions={"trajectories": versions["trajectories"]} if versions else None)
    try:
        return con.execute(FRESH_SQL, {"policy": policy_version}).fetch_arrow_table()
    finally:
        con.close()


FRESH_ANY_POLICY_SQL = """
select t.* from trajectories t
where t.kept and t.rollout_id not in (""" + ckpt.CONSUMED_SQL + """)
"""


def trainable_trajectories(lake: Lakehouse, policy_version: str, max_policy_lag: int,
                           versions: dict[str, int | None] | None = None) -> tuple[list[dict], int]:
    """(untrained kept trajectories sampled at most ``max_policy_lag`` policy versions behind
    ``policy_version``, the number of untrained ones refused as older or outside its chain); see
    ``training/policy_lag.py``. With ``max_policy_lag = 0`` the rows are :func:`untrained_trajectories`'."""
    con = lake.duckdb(["trajectories", "checkpoints", "training_claims"],
                      versions={"trajectories": versions["trajectories"]} if versions else None)
    try:
        rows = con.execute(FRESH_ANY_POLICY_SQL).fetch_arrow_table().to_pylist()
    finally:
        con.close()
    kept, refused = split_by_lag(rows, policy_lags(checkpoint_parents(lake), policy_version), max_policy_lag)
    return kept, len(refused)


def fresh_trajectory_count(lake: Lakehouse, paths: Paths) -> int:
    version, _ = current_policy(lake, paths)
    return untrained_trajectories(lake, version).num_rows


@ckpt.abandons_claims_on_error
def train_checkpoint(
    lake: Lakehouse, paths: Paths, policy: PolicySettings, config: GRPOConfig, *, promote: bool = True, on_step=None,
    launcher=None, window=None,
) -> StageResult:
    """Train a checkpoint on the serving policy's fresh trajectories (those at most
    ``config.max_policy_lag`` versions old; the count refused is in the metadata) and record it.

    Here, in the caller's process: pin the tables' versions, claim the fresh trajectories, name the
    checkpoint. The training itself (:func:`run_training`) runs wherever ``launcher`` puts it
    (``training/launchers.py``, ``assets/launchers.py``; None: in this process). Then here again: the lineage, the checkpoint row,
    the promotion, the claim's end. A launch that fails leaves nothing under the checkpoint's id.
    ``window`` (an ``stages.idle_window.WindowRun``) pins a resumed run's rows and saves its progress as
    it trains (in this process)."""
    ckpt.reconcile(lake, paths)  # settle what earlier crashed runs left (see training/checkpoints.py)
    version, adapter = current_policy(lake, paths)
    # Pin every table's version before reading anything: the manifest then names exactly what was read.
    versions = lineage.table_versions(lake)
    fresh, refused = trainable_trajectories(lake, version, config.max_policy_lag, versions)
    fresh = lineage.order_trajectories(fresh)
    if window is not None:  # an idle window resuming a saved run trains on that run's rows
        versions, fresh = window.pin(lake, version, versions, fresh, refused)
    if not fresh:
        raise ValueError(
            f"no fresh trajectories for policy {version!r}: run rollouts for a new batch first "
            f"(every trajectory sampled by this policy has been trained on; {refused} untrained ones are more than "
            f"trainer.max_policy_lag = {config.max_policy_lag} versions old)"
        )
    ids = {r["rollout_id"] for r in fresh}
    claim = ckpt.claim_training(lake, paths, version, ids, promote=promote)  # a second trainer fails fast here
    batches = sorted({r["batch_id"] for r in fresh})
    # Each sample carries the temperature it was sampled at; the config's is only a fallback.
    config = GRPOConfig(**{**config.to_dict(), "max_completion_length": policy.max_new_tokens})
    checkpoint_id = claim.checkpoint_id
    job = launchers.TrainingJob(
        lakehouse=str(lake.root), checkpoints=str(paths.checkpoints), models=str(paths.models), checkpoint_id=checkpoint_id,
        policy_version=version, parent_adapter=None if adapter is None else str(adapter), versions=dict(versions),
        trajectory_ids=[r["rollout_id"] for r in fresh], model=policy.model, base_model=policy.model_name, config=config.to_dict())
    try:
        if window is not None:  # an idle window saves its progress from this process: it trains here
            if launcher is not None and not isinstance(launcher, InProcessLauncher):
                raise ValueError(f"an idle window trains in process (its progress is saved by this process), not through "
                                 f"the {launcher.name!r} launcher: set trainer.launcher = in_process for idle windows")
            result = run_training(job, on_step=on_step, progress=window.checkpointing())
        else:
            result = (launcher or InProcessLauncher()).launch(job, on_step)
    except BaseException:
        launchers.discard_partial(paths.checkpoints, checkpoint_id)  # no half checkpoint, wherever it trained
        raise
    path = ckpt.verify_adapter(result.adapter_path)
    lineage.record(lake, result.manifest)  # before the checkpoint row: a recorded checkpoint always has its lineage
    metrics = {**result.metrics, "reward_mean": sum(t["reward"] for t in fresh) / len(fresh),
               "accuracy_mean": sum(t["outcome_reward"] for t in fresh) / len(fresh)}
    ckpt.record_checkpoint(
        lake,
        {
            "checkpoint_id": checkpoint_id,
            "parent_id": None if version == "base" else version,
            "base_model": policy.model_name,
            "adapter_uri": str(path),
            "algorithm": config.loss_type,
            "config": config.to_dict(),
            "trained_on": batches,
            "trajectory_ids": sorted(ids),
            "trajectory_count": len(fresh),
            "metrics": metrics,
            "promoted": False,
        },
    )
    if promote:  # only over the policy it trained from: a promotion or rollback made meanwhile wins
        serving.promote(lake, checkpoint_id, actor="trainer", reason=f"trained on {len(fresh)} fresh trajectories of {version} "
                        "(trainer.promotion = always)", expect_from=version)
    ckpt.finish_claim(lake, claim)
    if window is not None:
        window.finished()
    return StageResult(
        1,
        {
            "checkpoint_id": checkpoint_id,
            "parent_id": version,
            "promoted": promote,
            "trained_on": ", ".join(batches),
            "max_policy_lag": config.max_policy_lag,
            "refused_policy_lag": refused,  # untrained rows older than max_policy_lag versions
            "history": markdown_table(result.history, limit=50),
            **{k: round(v, 5) if isinstance(v, float) else v for k, v in metrics.items()},
        },
    )


def claimed_trajectories(lake: Lakehouse, versions: dict[str, int | None], ids: list[str]) -> list[dict]:
    """The trajectories rows ``ids`` as of ``versions['trajectories']``, in training order; raises when one
    is missing (the job was built against other table versions)."""
    import pyarrow.compute as pc

    wanted = set(ids)
    # Filtered in the scan: a long-lived lakehouse holds far more trajectories than one job names.
    table = lake.dataset("trajectories", version=versions.get("trajectories")).to_table(filter=pc.field("rollout_id").isin(sorted(wanted)))
    rows = table.to_pylist()
    missing = wanted - {r["rollout_id"] for r in rows}
    if missing or len(rows) != len(wanted):
        raise ValueError(f"the training job names {len(missing)} trajectories not in trajectories@{versions.get('trajectories')} "
                         f"(or names one twice): {sorted(missing)[:5]}; the job and the lakehouse disagree, train again")
    return lineage.order_trajectories(rows)


def run_training(job: launchers.TrainingJob, on_step=None, progress=None) -> launchers.TrainingOutput:
    """The training entry point every launcher runs: the job's trajectories read at its pinned versions,
    GRPO on a LoRA adapter that continues the parent's (optimizer state included), and the adapter folder
    written atomically under ``job.checkpoints`` with its trainer state, lineage manifest and metrics.
    Writes no table: the caller records the lineage and the checkpoint row from what this returns."""
    from transformers import AutoTokenizer

    lake = Lakehouse(job.lakehouse)
    versions = job.versions
    fresh = claimed_trajectories(lake, versions, job.trajectory_ids)
    model_dir = resolve_model(job.model, Path(job.models))
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    config = GRPOConfig(**job.config)
    grounding_counts: dict[str, int] = {}
    samples, rollouts = build_training_samples(lake, tokenizer, fresh, versions, grounding_policy=config.grounding_policy,
                                               grounding_penalty=config.grounding_penalty, grounding_counts=grounding_counts)
    if not any(abs(s.advantage) > 1e-8 or any(abs(a) > 1e-8 for a in (s.token_advantages or [])) for s in samples):
        raise ValueError(
            f"the {len(samples)} fresh trajectories carry no learning signal (every group's rewards are equal): "
            "sample more generations per task, raise the temperature, or add easier tasks"
        )
    version = job.policy_version
    manifest = lineage.build_manifest(
        lake, checkpoint_id=job.checkpoint_id, parent_id=None if version == "base" else version, policy_version=version, versions=versions,
        trajectories=fresh, rollouts=rollouts, samples=samples, config=config.to_dict(), base_model=job.base_model, model=str(model_dir))
    adapter = None if job.parent_adapter is None else Path(job.parent_adapter)
    model = build_policy(model_dir, adapter, config)
    # The chain continues: AdamW's moments and the schedule's step come from the parent checkpoint.
    state = load_trainer_state(adapter, next(model.parameters()).device)
    # (progress only for an idle window: callers that wrap train_grpo with the older signature keep working)
    windowed = {"progress": progress} if progress is not None else {}
    result = train_grpo(model, tokenizer, samples, config, state=state, on_step=on_step, **windowed)
    if config.grounding_policy != "off":  # what the grounding flags changed, in the checkpoint's metrics
        result.metrics.update({f"grounding_{k}": v for k, v in
                               {"penalized_tokens": 0, "blocked_turns": 0, **grounding_counts}.items()})

    def extra(folder):  # written inside the atomic save: the adapter never lands without them
        save_trainer_state(folder, result.state)
        lineage.write_manifest_file(folder, manifest)
        launchers.write_output_file(folder, result.metrics, result.history)

    path = ckpt.save_adapter(model, Path(job.checkpoints), job.checkpoint_id, extra=extra)
    return launchers.TrainingOutput(str(path), result.metrics, manifest, result.history)


class InProcessLauncher:
    """The entry point called right here, in the Dagster step's process (the default launcher)."""

    name = "in_process"

    def launch(self, job: launchers.TrainingJob, on_step: launchers.OnStep = None) -> launchers.TrainingOutput:
        return run_training(job, on_step=on_step)


def summarize(lake: Lakehouse) -> dict[str, Any]:
    """Numbers for `tentalis status`."""
    con = lake.duckdb()
    try:
        q = lambda s: con.execute(s).fetchall()  # noqa: E731
        out = {
            "batches": q("select count(distinct batch_id) from tasks")[0][0],
            "tasks": q("select count(*) from tasks")[0][0],
            "rollouts": q("select count(*) from rollouts")[0][0],
            "trajectories": q("select count(*) from trajectories")[0][0],
            "quarantined": q("select count(*) from quarantine")[0][0],
            "checkpoints": q("select checkpoint_id, parent_id, promoted, trajectory_count, metrics, created_at from checkpoints order by created_at")
        }
        last = q("select batch_id, avg(reward), avg(outcome_reward) from trajectories group by batch_id order by max(created_at) desc limit 1")
        out["last_batch"] = last[0] if last else None
        return out
    finally:
        con.close()
