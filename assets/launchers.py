"""Training launchers, the Dagster side: the Pipes launchers (a local subprocess, a Ray job) and the
choice between them.

The library's half (``tentalis_pipelines/training/launchers.py``) holds the :class:`TrainingJob` every
launcher runs, what a run hands back and the cleanup after a failed one; the child process of a Pipes
launch is ``tentalis_pipelines/stages/pipes_entry.py``. What needs Dagster, its ``PipesSubprocessClient``
and dagster-ray's ``PipesRayJobClient``, lives here, so the library never imports Dagster
(docs/architecture.md, "The import structure"). dagster-ray is imported lazily: it is the extra ``ray``.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Any

from tentalis_pipelines.stages.training import InProcessLauncher
from tentalis_pipelines.training.launchers import (
    ENTRY_MODULE,
    JOB_EXTRA,
    LAUNCHERS,
    TINKER_REFUSAL,
    LauncherError,
    OnStep,
    TrainingJob,
    TrainingOutput,
    forwarded_env,
    output_from_messages,
)


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
