"""The progress of `tentalis run` and `learn` (``cli/progress.py``), fed by hand with a fake clock: one
flushed line per finished stage, job and cycle in ``lines`` mode (a CI log), ``\\r`` redraws of one line
that end with a newline in ``bar`` mode (a terminal), nothing in ``none``; the mode's choice; and the
feed that turns a run's Dagster events (read by their attributes, faked here) into those lines."""

from __future__ import annotations

import io
from types import SimpleNamespace

import pytest

from tentalis_pipelines.cli.progress import (
    BarProgress,
    JobEvents,
    LineProgress,
    Progress,
    clock_time,
    duration,
    make_progress,
    resolve_mode,
)


class Clock:
    def __init__(self, t: float = 0.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


class Recorder(io.StringIO):
    """A stream that notes, at every flush, everything written so far."""

    def __init__(self):
        super().__init__()
        self.flushed: list[str] = []

    def flush(self) -> None:
        self.flushed.append(self.getvalue())
        super().flush()


def screen(text: str) -> list[str]:
    """What a terminal shows of ``text``: each ``\\r`` returns to the line's start and overwrites it."""
    lines = []
    for raw in text.split("\n"):
        shown = ""
        for piece in raw.split("\r"):
            shown = piece + shown[len(piece):]
        lines.append(shown.rstrip())
    return lines


def one_cycle(p: Progress, clock: Clock, label: str = "cycle 1/2", start: float = 0.0) -> None:
    """A cycle of one job with two stages, as run_cycle tells it."""
    clock.t = start
    p.cycle_started(label)
    p.job_about_to_run("rollouts of batch-1")
    p.job_started("rollout_job", steps=2)
    clock.t = start + 1.0
    p.stage_started("rollouts")
    clock.t = start + 43.1
    p.stage_finished("rollouts")
    p.stage_started("trajectories")
    clock.t = start + 48.5
    p.stage_finished("trajectories")
    p.job_finished("rollout_job", 48.0, "batch-1", "run-a")
    clock.t = start + 252.0
    p.cycle_finished()


def test_formats():
    assert duration(42.14) == "42.1 s" and duration(0) == "0.0 s" and duration(59.96) == "1:00"
    assert duration(252.0) == "4:12" and duration(3723.0) == "1:02:03"
    assert clock_time(63.2) == "1:03" and clock_time(0.2) == "0:00" and clock_time(3600) == "1:00:00"


def test_lines_mode_prints_one_flushed_line_per_stage_job_and_cycle():
    clock, out = Clock(), Recorder()
    p = LineProgress(out, clock)
    one_cycle(p, clock)
    one_cycle(p, clock, "cycle 2/2", start=300.0)
    lines = out.getvalue().splitlines()
    assert lines == [
        "[cycle 1/2] rollouts done in 42.1 s (elapsed 0:43)",
        "[cycle 1/2] trajectories done in 5.4 s (elapsed 0:48)",
        "[cycle 1/2] rollout_job done in 48.0 s: batch-1, run run-a (elapsed 0:48)",
        "[cycle 1/2] done in 4:12 (elapsed 4:12)",
        # the second cycle's elapsed time counts from the command's start, its own time from its start
        "[cycle 2/2] rollouts done in 42.1 s (elapsed 5:43)",
        "[cycle 2/2] trajectories done in 5.4 s (elapsed 5:48)",
        "[cycle 2/2] rollout_job done in 48.0 s: batch-1, run run-a (elapsed 5:48)",
        "[cycle 2/2] done in 4:12 (elapsed 9:12)",
    ]
    assert "\r" not in out.getvalue()
    # each line reached the stream whole and flushed the moment its event happened
    assert [s for s in out.flushed if s] == ["\n".join(lines[: i + 1]) + "\n" for i in range(len(lines))]


def test_a_failed_stage_and_its_cycle_are_named():
    clock, out = Clock(), io.StringIO()
    p = LineProgress(out, clock)
    p.cycle_started("cycle 1/1")
    p.job_started("rollout_job", 7)
    clock.t = 0.8
    p.stage_started("tasks")
    clock.t = 1.0
    p.stage_failed("tasks", "Can't load tokenizer for '/m'")
    p.cycle_failed()
    p.cycle_failed()  # told twice (the caller's clean-up): one line
    assert out.getvalue().splitlines() == [
        "[cycle 1/1] tasks failed after 0.2 s: Can't load tokenizer for '/m' (elapsed 0:01)",
        "[cycle 1/1] failed after 1.0 s (elapsed 0:01)",
    ]


def test_a_skipped_stage_and_a_note():
    clock, out = Clock(), io.StringIO()
    p = LineProgress(out, clock)
    p.cycle_started("cycle 1/1")
    p.note("resuming batch-1")
    p.stage_skipped("guided_rollouts")
    assert out.getvalue().splitlines() == ["[cycle 1/1] note: resuming batch-1", "[cycle 1/1] guided_rollouts skipped (elapsed 0:00)"]


def test_bar_mode_redraws_one_line_and_ends_with_a_newline():
    clock, out = Clock(), io.StringIO()
    p = BarProgress(out, clock, tick=None, width=100)
    clock.t = 0.0
    p.cycle_started("cycle 1/2")
    p.job_about_to_run("rollouts of batch-1")
    p.job_started("rollout_job", steps=2)
    clock.t = 1.0
    p.stage_started("rollouts")
    assert out.getvalue().endswith("\r[cycle 1/2] 0:01 rollout_job [....................] 0/2 rollouts (rollouts of batch-1)")
    clock.t = 43.1
    p.stage_finished("rollouts")
    assert out.getvalue().rstrip().endswith("\r[cycle 1/2] 0:43 rollout_job [##########..........] 1/2 (rollouts of batch-1)")
    p.stage_started("trajectories")
    clock.t = 48.5
    p.stage_finished("trajectories")
    p.job_finished("rollout_job", 48.0, "batch-1", "run-a")
    clock.t = 252.0
    p.cycle_finished()
    text = out.getvalue()
    assert text.count("\r") > 4 and text.endswith("\n")
    # a stage's end only moves the bar; the job and the cycle stay on screen, the bar's line is gone
    assert [line for line in screen(text) if line] == [
        "[cycle 1/2] rollout_job done in 48.0 s: batch-1, run run-a (elapsed 0:48)",
        "[cycle 1/2] done in 4:12 (elapsed 4:12)",
    ]


def test_bar_mode_never_wraps_and_keeps_failures_and_notes():
    clock, out = Clock(), io.StringIO()
    p = BarProgress(out, clock, tick=None, width=30)
    p.cycle_started("cycle 1/1")
    p.job_started("benchmark_job", steps=1)
    p.stage_started("benchmark_results")
    assert all(len(piece) <= 29 for line in out.getvalue().split("\n") for piece in line.split("\r"))
    p.note("curriculum: levels 1, 2")
    clock.t = 3.0
    p.stage_failed("benchmark_results", "boom")
    p.cycle_failed()
    assert [line for line in screen(out.getvalue()) if line] == [
        "[cycle 1/1] note: curriculum: levels 1, 2",
        "[cycle 1/1] benchmark_results failed after 3.0 s: boom (elapsed 0:03)",
        "[cycle 1/1] failed after 3.0 s (elapsed 0:03)",
    ]


def test_an_interrupted_bar_ends_its_line():
    out = io.StringIO()
    p = BarProgress(out, Clock(), tick=None, width=80)
    p.cycle_started("cycle 1/1")
    p.job_started("train_job", steps=1)
    p.close()
    assert out.getvalue().endswith("\n") and screen(out.getvalue())[0] == "[cycle 1/1] 0:00 train_job [....................] 0/1"


def test_bar_mode_ticks_on_its_own():
    """Between events a thread redraws the elapsed time; it stops with the cycle."""
    import threading

    clock, out = Clock(), io.StringIO()
    p = BarProgress(out, clock, tick=0.01, width=80)
    p.cycle_started("cycle 1/1")
    clock.t = 7.0
    drawn = threading.Event()
    for _ in range(500):
        if out.getvalue().endswith("\r[cycle 1/1] 0:07 starting"):
            drawn.set()
            break
        drawn.wait(0.01)
    assert drawn.is_set(), out.getvalue()
    p.cycle_finished()
    ended = out.getvalue()
    drawn.clear()
    drawn.wait(0.1)  # ten ticks' time: nothing more is drawn
    assert out.getvalue() == ended and ended.endswith("\n")


def test_none_prints_nothing_but_notes():
    clock, out = Clock(), io.StringIO()
    p = make_progress("none", out, clock)
    one_cycle(p, clock)
    p.stage_failed("tasks", "boom")
    p.cycle_failed()
    assert out.getvalue() == ""
    p.note("nothing to train on")
    assert out.getvalue() == "[cycle 1/2] note: nothing to train on\n"


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_mode_is_the_option_else_the_environment_else_the_terminal(monkeypatch):
    monkeypatch.delenv("TENTALIS_PROGRESS", raising=False)
    assert resolve_mode(None, Tty()) == "bar" and resolve_mode(None, io.StringIO()) == "lines"
    assert resolve_mode("auto", Tty()) == "bar" and resolve_mode("lines", Tty()) == "lines"
    monkeypatch.setenv("TENTALIS_PROGRESS", "none")
    assert resolve_mode(None, Tty()) == "none" and resolve_mode("bar", io.StringIO()) == "bar"
    with pytest.raises(ValueError, match=r"--progress 'sparkle': choose auto, lines, bar, none"):
        resolve_mode("sparkle")
    monkeypatch.setenv("TENTALIS_PROGRESS", "Loud")
    with pytest.raises(ValueError, match=r"\$TENTALIS_PROGRESS 'loud'"):
        resolve_mode(None)
    assert isinstance(make_progress("lines"), LineProgress) and isinstance(make_progress("bar", tick=None), BarProgress)
    assert type(make_progress("none")) is Progress


def _entry(run_id: str, kind: str | None, step: str | None = None, **event):
    dagster_event = None if kind is None else SimpleNamespace(event_type_value=kind, step_key=step, **event)
    return SimpleNamespace(run_id=run_id, step_key=step, dagster_event=dagster_event)


def test_a_runs_dagster_events_become_lines_as_they_happen():
    from jobs.runner import JobRun, step_error

    clock, out = Clock(), io.StringIO()
    p = LineProgress(out, clock)
    bar_steps = []
    feed = JobEvents(p, steps_of=lambda job: bar_steps.append(job) or 2, error_of=step_error)
    p.cycle_started("cycle 1/1")
    feed.about_to_run("rollouts of batch-1")
    feed.event("rollout_job", _entry("r1", "PIPELINE_START"))
    feed.event("rollout_job", _entry("r1", "STEP_START", "tasks"))
    feed.event("rollout_job", _entry("r1", None, "tasks"))  # a log message: no event
    clock.t = 2.5
    feed.event("rollout_job", _entry("r1", "ASSET_MATERIALIZATION", "tasks"))
    feed.event("rollout_job", _entry("r1", "STEP_SUCCESS", "tasks"))
    assert out.getvalue() == "[cycle 1/1] tasks done in 2.5 s (elapsed 0:02)\n"  # at the step's end, not the job's
    feed.event("rollout_job", _entry("r1", "STEP_START", "rollouts"))
    clock.t = 4.0
    cause = SimpleNamespace(message="Can't load tokenizer for '/m'\nmore", cls_name="OSError", cause=None)
    wrapper = SimpleNamespace(message="Error occurred while executing op", cls_name="DagsterExecutionStepExecutionError", cause=cause)
    feed.event("rollout_job", _entry("r1", "STEP_FAILURE", "rollouts", step_failure_data=SimpleNamespace(error=wrapper)))
    feed.event("rollout_job", _entry("r1", "PIPELINE_FAILURE"))
    feed.finished(JobRun("rollout_job", "r1", "batch-1", 4.0))
    assert out.getvalue().splitlines()[1:] == [
        "[cycle 1/1] rollouts failed after 1.5 s: Can't load tokenizer for '/m' (elapsed 0:04)",
        "[cycle 1/1] rollout_job done in 4.0 s: batch-1, run r1 (elapsed 0:04)",
    ]
    assert bar_steps == ["rollout_job"]  # asked once, at the run's first event
    # a second run of the same job is a new job for the bar; an unreadable error still names the stage
    feed.event("benchmark_job", _entry("r2", "STEP_FAILURE", "benchmark_results", step_failure_data=None))
    assert bar_steps == ["rollout_job", "benchmark_job"] and p.job == "benchmark_job"
    assert out.getvalue().splitlines()[-1] == "[cycle 1/1] benchmark_results failed after 0.0 s (elapsed 0:04)"


def test_a_job_without_a_known_step_count_still_reports():
    def unknown(job):
        raise KeyError(job)

    clock, out = Clock(), io.StringIO()
    p = BarProgress(out, clock, tick=None, width=80)
    feed = JobEvents(p, steps_of=unknown)
    p.cycle_started("cycle 1/1")
    feed.event("train_job", _entry("r1", "STEP_START", "checkpoints"))
    assert screen(out.getvalue())[-1] == "[cycle 1/1] 0:00 train_job 0 done checkpoints"
