"""Training launchers, the library's half: the job a launcher runs, what it hands back, and the cleanup.

The ``checkpoints`` stage (``stages/training.py``) settles everything that needs the lakehouse's
bookkeeping in the Dagster step itself: it pins the Delta versions, picks and claims the fresh
trajectories and names the checkpoint. What is left, the training, is a :class:`TrainingJob` (plain
JSON: the pinned versions, the trajectory ids, the model and the config) handed to a launcher. Every
launcher runs the same entry point, ``stages.training.run_training``, which reads the rows at the
pinned versions, trains, and writes the adapter folder atomically (``checkpoints.save_adapter``) with
its trainer state, lineage manifest and :data:`OUTPUT_FILE` (metrics and history). The stage then
records the lineage and the checkpoint row exactly as it always did, so a checkpoint's row and lineage
never depend on where it trained.

* ``in_process``: the entry point called in the Dagster step (the default; what the project always did):
  ``stages.training.InProcessLauncher``.
* ``subprocess``: ``python -m tentalis_pipelines.stages.pipes_entry`` through Dagster's
  ``PipesSubprocessClient``; its log lines stream into the Dagster run.
* ``ray``: the same command as a Ray job, through ``dagster-ray``'s ``PipesRayJobClient``, on the Ray
  cluster at ``ray_address`` (its dashboard's HTTP address). The job reads the same lakehouse and
  writes into the same checkpoints folder, so a remote cluster needs both on shared storage (the
  lakehouse on an object store, ``TENTALIS_HOME`` on a shared volume) and the same Python environment.
* ``tinker``: refused with the reason (see ``docs/launchers.md#tinker``): Tinker is a hosted service with
  no local mode, and SkyRL's Tinker-API server cannot share this environment.

The two Pipes launchers, the Ray job's log reader and :func:`~assets.launchers.make_launcher` live on the
Dagster side, in ``assets/launchers.py``: the library never imports Dagster (docs/architecture.md,
"The import structure"). The child side of a Pipes launch is ``stages/pipes_entry.py``.

A launch that fails or is killed leaves no half checkpoint: the adapter only ever appears by one
rename, and :func:`discard_partial` removes whatever the failed run left under its checkpoint id
(the stage calls it before the claim is abandoned).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

LAUNCHERS = ("in_process", "subprocess", "ray", "tinker")
# The command every external launcher runs (``python -m`` it), reading its job from the Pipes extras.
ENTRY_MODULE = "tentalis_pipelines.stages.pipes_entry"
# The Pipes extra that carries the job.
JOB_EXTRA = "training_job"
# Written into the adapter folder inside the atomic save: the training's metrics and per-step history.
OUTPUT_FILE = "training_output.json"
# Environment the external side needs to find the same state and code (only those that are set travel).
FORWARDED_ENV = ("TENTALIS_HOME", "TENTALIS_LAKEHOUSE_URI", "TENTALIS_DATA_DIR", "PYTHONPATH", "OMP_NUM_THREADS",
                 "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_REGION", "AWS_ENDPOINT_URL",
                 "AWS_ALLOW_HTTP", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")

TINKER_REFUSAL = (
    "launcher 'tinker' is not available: Tinker is a hosted training service (its maintainers say it has no "
    "local mode) and these machines cannot reach it; SkyRL's Tinker-API server skyrl-tx 0.3.0 needs "
    "transformers<5 (Tentalis pins 5.23.0) and JAX, so it cannot share this environment, and no Tinker "
    "launcher is wired. docs/launchers.md#tinker says what one would send. Pick launcher 'in_process', "
    "'subprocess' or 'ray'."
)


class LauncherError(RuntimeError):
    """A launcher was misconfigured, or its external run did not hand back a complete result."""


@dataclass
class TrainingJob:
    """One training run, as plain JSON: everything the entry point needs and nothing it must not touch.

    ``versions`` are the Delta versions the stage pinned before reading; ``trajectory_ids`` the claimed
    fresh trajectories (the entry point reads exactly these rows at ``versions['trajectories']``);
    ``parent_adapter`` the serving checkpoint's folder the adapter continues from (None: the base model)."""

    lakehouse: str
    checkpoints: str
    models: str
    checkpoint_id: str
    policy_version: str
    parent_adapter: str | None
    versions: dict[str, int | None]
    trajectory_ids: list[str]
    model: str
    base_model: str
    config: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> TrainingJob:
        names = {f.name for f in dataclasses.fields(cls)}
        missing, unknown = names - set(raw), set(raw) - names
        if missing or unknown:
            raise LauncherError(f"a training job needs exactly the fields {sorted(names)}: missing {sorted(missing)}, "
                                f"unknown {sorted(unknown)} (was it written by another Tentalis version?)")
        return cls(**raw)


@dataclass
class TrainingOutput:
    """What a training run hands back: the complete adapter folder, and what it holds besides the weights."""

    adapter_path: str
    metrics: dict[str, Any]
    manifest: dict[str, Any]
    history: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def from_folder(cls, folder: str | Path) -> TrainingOutput:
        """Read a finished run's output from its adapter folder (checked complete first)."""
        from tentalis_pipelines import lineage
        from tentalis_pipelines.training.checkpoints import verify_adapter

        path = verify_adapter(folder)
        for name in (OUTPUT_FILE, lineage.MANIFEST_FILE):
            if not (path / name).exists():
                raise LauncherError(f"{path} has no {name}: it was not written by the training entry point")
        out = json.loads((path / OUTPUT_FILE).read_text())
        return cls(str(path), out["metrics"], json.loads((path / lineage.MANIFEST_FILE).read_text()), out.get("history", []))


def write_output_file(folder: Path, metrics: dict[str, Any], history: list[dict[str, Any]]) -> Path:
    """Write :data:`OUTPUT_FILE` (called inside the atomic save, so it lands with the adapter)."""
    path = Path(folder) / OUTPUT_FILE
    path.write_text(json.dumps({"metrics": metrics, "history": history}, sort_keys=True, default=float))
    return path


def discard_partial(checkpoints: Path, checkpoint_id: str) -> list[str]:
    """Remove what a failed or killed run left for ``checkpoint_id``: its temporary folders and, if the
    rename happened, the adapter folder (no row points at it yet: the stage writes the row only after the
    launcher returned). Returns the removed names."""
    removed = []
    root = Path(checkpoints)
    if not root.is_dir():
        return removed
    for p in [*root.glob(f".tmp-{checkpoint_id}-*"), root / checkpoint_id]:
        if p.is_dir():
            shutil.rmtree(p, ignore_errors=True)
            removed.append(p.name)
    return removed


OnStep = Callable[[dict[str, Any]], None] | None


def forwarded_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment variables an external run gets from this process (:data:`FORWARDED_ENV` that are set)."""
    env = {k: os.environ[k] for k in FORWARDED_ENV if os.environ.get(k)}
    return {**env, **(extra or {})}


def output_from_messages(messages: list[Any], job: TrainingJob) -> TrainingOutput:
    """The output an external run reported (a Pipes custom message ``{"adapter_path": ...}``), read back from
    its adapter folder; raises ``LauncherError`` when the run reported nothing or another checkpoint."""
    reported = [m for m in messages if isinstance(m, dict) and "adapter_path" in m]
    if not reported:
        raise LauncherError(f"the external training run for {job.checkpoint_id} exited without reporting its adapter "
                            "(see its log lines in the Dagster run)")
    path = Path(reported[-1]["adapter_path"])
    if path.name != job.checkpoint_id or path.parent.resolve() != Path(job.checkpoints).resolve():
        raise LauncherError(f"the external run reported {path}, not {Path(job.checkpoints) / job.checkpoint_id}")
    return TrainingOutput.from_folder(path)
