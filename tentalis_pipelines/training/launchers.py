"""Training launchers: one training entry point, run in this process, a Dagster Pipes subprocess or a Ray job.

The ``checkpoints`` stage (``stages/training.py``) settles everything that needs the lakehouse's
bookkeeping in the Dagster step itself: it pins the Delta versions, picks and claims the fresh
trajectories and names the checkpoint. What is left, the training, is a :class:`TrainingJob` (plain
JSON: the pinned versions, the trajectory ids, the model and the config) handed to a launcher. Every
launcher runs the same entry point, ``stages.training.run_training``, which reads the rows at the
pinned versions, trains, and writes the adapter folder atomically (``checkpoints.save_adapter``) with
its trainer state, lineage manifest and :data:`OUTPUT_FILE` (metrics and history). The stage then
records the lineage and the checkpoint row exactly as it always did, so a checkpoint's row and lineage
never depend on where it trained.

* ``in_process``: the entry point called in the Dagster step (the default; what the project always did).
* ``subprocess``: ``python -m tentalis_pipelines.training.pipes_entry`` through Dagster's
  ``PipesSubprocessClient``; its log lines stream into the Dagster run.
* ``ray``: the same command as a Ray job, through ``dagster-ray``'s ``PipesRayJobClient``, on the Ray
  cluster at ``ray_address`` (its dashboard's HTTP address). The job reads the same lakehouse and
  writes into the same checkpoints folder, so a remote cluster needs both on shared storage (the
  lakehouse on an object store, ``TENTALIS_HOME`` on a shared volume) and the same Python environment.
* ``tinker``: refused with the reason (see ``docs/launchers.md#tinker``): Tinker is a hosted service with
  no local mode, and SkyRL's Tinker-API server cannot share this environment.

A launch that fails or is killed leaves no half checkpoint: the adapter only ever appears by one
rename, and :func:`discard_partial` removes whatever the failed run left under its checkpoint id
(the stage calls it before the claim is abandoned). The Pipes launchers import Dagster lazily, so the
training modules still import without it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

LAUNCHERS = ("in_process", "subprocess", "ray", "tinker")
# The command every external launcher runs (``python -m`` it), reading its job from the Pipes extras.
ENTRY_MODULE = "tentalis_pipelines.training.pipes_entry"
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


class InProcessLauncher:
    """The entry point called right here, in the Dagster step's process (the default)."""

    name = "in_process"

    def launch(self, job: TrainingJob, on_step: OnStep = None) -> TrainingOutput:
        # Imported here: the stage imports this module, and the entry point lives with the stage.
        from tentalis_pipelines.stages.training import run_training

        return run_training(job, on_step=on_step)


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


class PipesSubprocessLauncher:
    """The entry point as a local subprocess through Dagster's ``PipesSubprocessClient`` (``context``: the
    asset's execution context; the subprocess's Pipes log lines become the run's log lines)."""

    name = "subprocess"

    def __init__(self, context, python: str | None = None):
        self.context = context
        self.python = python or sys.executable

    def launch(self, job: TrainingJob, on_step: OnStep = None) -> TrainingOutput:
        from dagster import PipesSubprocessClient

        invocation = PipesSubprocessClient().run(
            context=self.context, command=[self.python, "-m", ENTRY_MODULE], extras={JOB_EXTRA: job.to_dict()},
            env=forwarded_env())
        return output_from_messages(invocation.get_custom_messages(), job)


class PipesRayLauncher:
    """The entry point as a Ray job through ``dagster-ray``'s ``PipesRayJobClient``.

    ``address``: the Ray dashboard's HTTP address (``http://head:8265``); ``python``: the interpreter on
    the cluster that has Tentalis installed; ``num_gpus``: GPUs the job's driver asks for (0 on a CPU
    cluster). A Dagster run that is terminated stops the Ray job (``forward_termination``)."""

    name = "ray"

    def __init__(self, context, address: str, python: str = "python", num_gpus: float = 0.0, poll_interval: float = 0.25):
        if not address:
            raise LauncherError("launcher 'ray' needs the Ray cluster's dashboard address: set trainer.ray_address "
                                "(or $TENTALIS_RAY_ADDRESS), e.g. http://127.0.0.1:8265")
        self.context, self.address, self.python = context, address, python
        self.num_gpus, self.poll_interval = num_gpus, poll_interval

    def submit_params(self, job: TrainingJob) -> dict[str, Any]:
        """The ``JobSubmissionClient.submit_job`` arguments (dagster-ray adds the Pipes bootstrap variables)."""
        params: dict[str, Any] = {"entrypoint": f"{self.python} -m {ENTRY_MODULE}",
                                  "runtime_env": {"env_vars": forwarded_env()},
                                  "submission_id": f"tentalis-{job.checkpoint_id}"}
        if self.num_gpus:
            params["entrypoint_num_gpus"] = self.num_gpus
        return params

    def launch(self, job: TrainingJob, on_step: OnStep = None) -> TrainingOutput:
        try:
            from dagster_ray import PipesRayJobClient
        except ImportError as exc:
            raise LauncherError("launcher 'ray' needs the extra `ray`: pip install -e '.[ray]' "
                                "(ray[default] and dagster-ray)") from exc
        client = PipesRayJobClient(address=self.address, poll_interval=self.poll_interval, message_reader=closing_ray_reader())
        invocation = client.run(context=self.context, submit_job_params=self.submit_params(job), extras={JOB_EXTRA: job.to_dict()})
        return output_from_messages(invocation.get_custom_messages(), job)


def closing_ray_reader():
    """dagster-ray's Ray job log reader, made to finish as soon as the job has.

    dagster-ray's reader follows the job's log stream until Ray closes it, and the Pipes session waits for
    the reader before the step can end. On a local cluster Ray delivered the last lines 2 s after the job
    had ended and closed the stream 3.9-5.3 s after (measured: a trivial Pipes job took 6.1 s, 0.8 s of it
    the job). This reader follows the stream while the job runs (log lines and step metrics still arrive
    live) and stops at the run's Pipes ``closed`` message. If the job ended first (the client polls its
    status), it stops following and reads the rest of the job's log, complete by then, in one request:
    every message the run sent is handled, in order, exactly once."""
    import asyncio

    from dagster._core.pipes.utils import extract_message_or_forward_to_stdout
    from dagster_ray.core.pipes import PipesRayJobMessageReader

    class ClosingRayJobMessageReader(PipesRayJobMessageReader):
        def __init__(self):
            super().__init__()
            self._lines_handled = 0  # non-empty log lines handed to the Pipes handler, in the log's order
            self._loop: asyncio.AbstractEventLoop | None = None
            self._task: asyncio.Task | None = None

        def _handle(self, handler, text: str) -> None:
            for line in text.split("\n"):
                if line:
                    extract_message_or_forward_to_stdout(handler, line)
                    self._lines_handled += 1

        def handle_job_logs(self, handler) -> None:
            import time

            loop = asyncio.new_event_loop()
            try:
                while (self._job_id is None or self._client is None) and not self.session_closed.is_set():
                    time.sleep(0.05)
                self.thread_ready.set()
                if self.session_closed.is_set():
                    return

                async def follow():
                    async for chunk in self.client.tail_job_logs(job_id=self.job_id):
                        self._handle(handler, chunk)
                        if handler.received_closed_message:  # every message the run sends precedes `closed`
                            return

                self._loop, self._task = loop, loop.create_task(follow())
                with contextlib.suppress(asyncio.CancelledError):  # cancelled by terminate(): the job has ended
                    loop.run_until_complete(self._task)
            finally:
                loop.close()
                self.completed.set()

        def terminate(self, handler) -> None:
            # Called when the session closes, after the client saw the job end (or stopped it): its log is final.
            self.session_closed.set()
            loop, task = self._loop, self._task
            if loop is not None and task is not None and not task.done():
                loop.call_soon_threadsafe(task.cancel)
            super().terminate(handler)  # joins the following thread
            if self._job_id is not None and self._client is not None and not handler.received_closed_message:
                rest = [ln for ln in self.client.get_job_logs(self.job_id).split("\n") if ln][self._lines_handled:]
                self._handle(handler, "\n".join(rest))

    return ClosingRayJobMessageReader()


def make_launcher(name: str, context=None, *, ray_address: str | None = None, python: str | None = None, num_gpus: float = 0.0):
    """The launcher called ``name`` (one of :data:`LAUNCHERS`); the Pipes ones need the asset's ``context``."""
    if name == "in_process":
        return InProcessLauncher()
    if name == "tinker":
        raise LauncherError(TINKER_REFUSAL)
    if name not in LAUNCHERS:
        raise LauncherError(f"unknown launcher {name!r}: pick one of {', '.join(LAUNCHERS)}")
    if context is None:
        raise LauncherError(f"launcher {name!r} runs through Dagster Pipes: launch it from the checkpoints asset "
                            "(a Dagster run), or use launcher 'in_process'")
    if name == "subprocess":
        return PipesSubprocessLauncher(context, python=python)
    return PipesRayLauncher(context, ray_address or "", python=python or "python", num_gpus=num_gpus)
