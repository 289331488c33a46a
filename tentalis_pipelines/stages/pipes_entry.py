"""The external side of a launched training: ``python -m tentalis_pipelines.stages.pipes_entry``.

Run by the ``subprocess`` and ``ray`` launchers (``assets/launchers.py``) inside a Dagster Pipes
session: the job comes in the Pipes extras, each optimizer update goes back as a log line, and the
finished adapter's folder and metrics as a custom message. The
training itself is the one entry point every launcher shares, ``stages.training.run_training``.

The one library module that imports ``dagster_pipes``: the Pipes protocol's child side, a small package
with no dependencies that never imports Dagster itself (docs/architecture.md, "The import structure").
"""

from __future__ import annotations


def main() -> None:
    from dagster_pipes import open_dagster_pipes

    from tentalis_pipelines.stages.training import run_training
    from tentalis_pipelines.training.launchers import JOB_EXTRA, TrainingJob

    with open_dagster_pipes() as pipes:
        job = TrainingJob.from_dict(pipes.get_extra(JOB_EXTRA))
        pipes.log.info(f"training {job.checkpoint_id} on {len(job.trajectory_ids)} trajectories of {job.policy_version}")

        def on_step(rec):
            pipes.log.info(f"update {rec['step']}: loss={rec['loss']:.4f} kl={rec['kl']:.5f}")

        out = run_training(job, on_step=on_step)
        # Small on purpose: a Ray job's log stream may split long lines; the folder holds the rest.
        numbers = {k: v for k, v in out.metrics.items() if isinstance(v, int | float) and not isinstance(v, bool)}
        pipes.report_custom_message({"adapter_path": out.adapter_path, "metrics": numbers})


if __name__ == "__main__":
    main()
