"""Progress of `tentalis run` and `learn` that a person can read anywhere: one line per finished stage,
job and cycle when the output is not a terminal (a CI log, a file, a pipe), one live line redrawn in
place when it is.

The mode is ``--progress`` (or ``$TENTALIS_PROGRESS``; the option wins):

``auto`` (the default)
    ``bar`` when standard output is a terminal, else ``lines``.
``lines``
    One line per event, written and flushed when the event happens, each starting with the cycle's label::

        [cycle 1/3] rollouts done in 42.1 s (elapsed 1:03)
        [cycle 1/3] rollout_job done in 48.0 s: batch-20261207-..., run 3f2c... (elapsed 1:09)
        [cycle 1/3] done in 4:12 (elapsed 4:12)

    A stage is one step of a job's run, named as the run names it (its step key: ``tasks``, ``rollouts``,
    ``step_scores``, ``reviews``, ``trajectories``, ``checkpoints``, ``benchmark_results``, ``serving``,
    ...); a job is one run of an asset job (``rollout_job``, ``train_job``, ``benchmark_job`` ...).
    A failed stage is ``[cycle 1/3] tasks failed after 0.2 s: <its own error> (elapsed 0:01)``, a failed
    cycle ``[cycle 1/3] failed after 0:12 (elapsed 0:12)``, a skipped stage ``... <stage> skipped``.
``bar``
    One line redrawn with ``\\r`` (every second, and at every event): the cycle, the time elapsed, the
    running job, a bar of its stages done out of its stages, the running stage and what the job does.
    Jobs, notes, failures and each cycle's end are printed as lasting lines above it (the same text as in
    ``lines``); the bar's line is erased and the output ends with a newline when the cycle ends.
``none``
    No progress at all.

Durations under a minute read ``42.1 s``, longer ones ``4:12`` (``1:02:03`` past an hour); ``elapsed`` is
the time since the command started, always ``m:ss`` (``h:mm:ss``). Notes (a resumed batch, the
curriculum's draw, a cycle with nothing to train on) are printed in every mode, ``none`` included: they
are not progress. `run` and `learn` print no machine-readable output, so progress goes to standard output
with the rest; the one-line error of a failed cycle goes to standard error as before.

Where the events come from: ``jobs.runner.run_cycle`` tells :class:`JobEvents` when a job is about to run
(``on_start``), every Dagster event of that job's run as the instance stores it (``on_event``:
``run_job`` registers ``DagsterInstance.add_event_listener`` on the run's id before the run starts, and
the in-process executor stores each event as it happens), and when the job's run ended (``on_run``). So a
stage's line is printed the moment its step ends, not when its job does. This module imports no Dagster:
events are read by their attributes (``dagster_event.event_type_value``, ``step_key``, ``run_id``).
"""

from __future__ import annotations

import os
import shutil
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, TextIO

MODES = ("auto", "lines", "bar", "none")
ENV = "TENTALIS_PROGRESS"
PROGRESS_HELP = (f"auto (a live bar on a terminal, else one line per finished stage, job and cycle, as in CI logs) | lines | bar | "
                 f"none; default: ${ENV}, else auto.")


def clock_time(seconds: float) -> str:
    """``m:ss``, or ``h:mm:ss`` past an hour (to the nearest second)."""
    whole = max(0, round(seconds))
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def duration(seconds: float) -> str:
    """``42.1 s`` under a minute, else :func:`clock_time`."""
    seconds = max(0.0, seconds)
    return f"{seconds:.1f} s" if round(seconds, 1) < 60 else clock_time(seconds)


def resolve_mode(option: str | None, stream: TextIO | None = None) -> str:
    """The rendering: ``option``, else ``$TENTALIS_PROGRESS``, else auto; auto is ``bar`` when ``stream``
    (standard output) is a terminal, else ``lines``. An unknown mode raises ValueError naming the choices."""
    mode = (option or os.environ.get(ENV) or "auto").strip().lower()
    if mode not in MODES:
        source = "--progress" if option else f"${ENV}"
        raise ValueError(f"{source} {mode!r}: choose {', '.join(MODES)}")
    if mode == "auto":
        stream = sys.stdout if stream is None else stream
        try:
            mode = "bar" if stream.isatty() else "lines"
        except (AttributeError, ValueError):  # no isatty, or a closed stream: not a terminal
            mode = "lines"
    return mode


class Progress:
    """The reporter: what a cycle tells, whatever the rendering. This base keeps the clocks and the
    counts and prints nothing but notes (the ``none`` mode); :class:`LineProgress` and
    :class:`BarProgress` render it. ``clock`` returns seconds (``time.monotonic``; a fake one in tests)."""

    def __init__(self, out: TextIO | None = None, clock: Callable[[], float] = time.monotonic):
        self.out = sys.stdout if out is None else out
        self.clock = clock
        self.t0 = clock()
        self.label = ""
        self.cycle_t0 = self.t0
        self.active = False  # between cycle_started and its end
        self.job: str | None = None
        self.what = ""  # what the running job does, in words (run_cycle's on_start)
        self.steps: int | None = None  # the running job's stages, when known
        self.done = 0  # stages of the running job that ended
        self.stage: str | None = None  # the stage running now
        self.stage_t0: dict[str, float] = {}

    # ------------------------------------------------------------------ what a cycle tells
    def cycle_started(self, label: str) -> None:
        self.label, self.cycle_t0, self.active = label, self.clock(), True
        self.job, self.what, self.steps, self.done, self.stage = None, "", None, 0, None
        self.stage_t0.clear()
        self._redraw()

    def job_about_to_run(self, what: str) -> None:
        """A job is about to run (before its first event); ``what`` says what it does."""
        self.what = what
        self._redraw()

    def job_started(self, job: str, steps: int | None = None) -> None:
        self.job, self.steps, self.done, self.stage = job, steps, 0, None
        self._redraw()

    def stage_started(self, stage: str) -> None:
        self.stage_t0[stage] = self.clock()
        self.stage = stage
        self._redraw()

    def stage_finished(self, stage: str) -> None:
        self._stage_ended(stage)
        self._emit(f"{stage} done in {duration(self._since(stage))}", lasting=False)

    def stage_skipped(self, stage: str) -> None:
        self._stage_ended(stage)
        self._emit(f"{stage} skipped", lasting=False)

    def stage_failed(self, stage: str, error: str = "") -> None:
        self._stage_ended(stage)
        self._emit(f"{stage} failed after {duration(self._since(stage))}" + (f": {error}" if error else ""), lasting=True)

    def job_finished(self, job: str, seconds: float, partition: str | None = None, run_id: str | None = None) -> None:
        where = ", ".join(x for x in (partition, f"run {run_id}" if run_id else None) if x)
        self.job, self.stage, self.what = None, None, ""
        self._emit(f"{job} done in {duration(seconds)}" + (f": {where}" if where else ""), lasting=True)

    def note(self, text: str) -> None:
        """Not progress: printed in every mode."""
        self._write_line(f"{self._prefix()}note: {text}")

    def cycle_finished(self) -> None:
        self._cycle_ended("done")

    def cycle_failed(self) -> None:
        self._cycle_ended("failed")

    def close(self) -> None:
        """The command ends (or is interrupted): nothing may be left half drawn."""
        self.active = False

    # ------------------------------------------------------------------ bookkeeping
    def elapsed(self) -> float:
        return self.clock() - self.t0

    def _since(self, stage: str) -> float:
        now = self.clock()
        return now - self.stage_t0.pop(stage, now)

    def _stage_ended(self, stage: str) -> None:
        self.done += 1
        if self.stage == stage:
            self.stage = None

    def _cycle_ended(self, how: str) -> None:
        if not self.active:
            return
        self.active = False
        took = self.clock() - self.cycle_t0
        self._emit(f"{how} in {duration(took)}" if how == "done" else f"{how} after {duration(took)}", lasting=True, end=True)

    def _prefix(self) -> str:
        return f"[{self.label}] " if self.label else ""

    def _line(self, text: str) -> str:
        return f"{self._prefix()}{text} (elapsed {clock_time(self.elapsed())})"

    # ------------------------------------------------------------------ rendering (none: nothing)
    def _emit(self, text: str, *, lasting: bool, end: bool = False) -> None:
        """An event worth a line: ``lasting`` ones stay on screen in bar mode too; ``end``: the cycle's last."""

    def _redraw(self) -> None:
        """The state changed (bar mode redraws its line)."""

    def _write_line(self, text: str) -> None:
        self.out.write(text + "\n")
        self.out.flush()


class LineProgress(Progress):
    """``lines``: one flushed line per finished (or failed, or skipped) stage, per job and per cycle."""

    def _emit(self, text: str, *, lasting: bool, end: bool = False) -> None:
        self._write_line(self._line(text))


class BarProgress(Progress):
    """``bar``: one line redrawn with ``\\r``; lasting events are printed above it. ``tick``: seconds
    between redraws of the elapsed time by a daemon thread (None: only at events, as in tests)."""

    BAR_WIDTH = 20

    def __init__(self, out: TextIO | None = None, clock: Callable[[], float] = time.monotonic, tick: float | None = 1.0,
                 width: int | None = None):
        super().__init__(out, clock)
        self.tick = tick
        self.width = width
        self.drawn = 0  # characters of the bar's line on screen now (its longest drawing, padded since)
        self.lock = threading.RLock()
        self._stop: threading.Event | None = None

    def cycle_started(self, label: str) -> None:
        super().cycle_started(label)
        if self.tick and self._stop is None:
            self._stop = threading.Event()
            threading.Thread(target=self._ticking, args=(self._stop,), daemon=True, name="tentalis-progress").start()

    def _ticking(self, stop: threading.Event) -> None:
        while not stop.wait(self.tick):
            self._redraw()

    def _stop_ticking(self) -> None:
        if self._stop is not None:
            self._stop.set()
            self._stop = None

    def render(self) -> str:
        """The bar's line now: the cycle, the time elapsed, the job, its stages done, the running stage and
        what the job does (last: the first cut on a narrow terminal)."""
        parts = [f"[{self.label}]" if self.label else "", clock_time(self.elapsed()), self.job or self.what or "starting"]
        if self.job and self.steps:
            filled = min(self.BAR_WIDTH, self.BAR_WIDTH * self.done // self.steps)
            parts.append(f"[{'#' * filled}{'.' * (self.BAR_WIDTH - filled)}] {min(self.done, self.steps)}/{self.steps}")
        elif self.job:
            parts.append(f"{self.done} done")
        if self.stage:
            parts.append(self.stage)
        if self.job and self.what:
            parts.append(f"({self.what})")
        return " ".join(p for p in parts if p)

    def _columns(self) -> int:
        return self.width or shutil.get_terminal_size((80, 24)).columns

    def _redraw(self) -> None:
        with self.lock:
            if not self.active:
                return
            text = self.render()[: max(1, self._columns() - 1)]  # never wraps: a wrapped line cannot be redrawn
            self.out.write("\r" + text + " " * max(0, self.drawn - len(text)))  # a shorter line covers the longer one
            self.out.flush()
            self.drawn = max(self.drawn, len(text))

    def _erase(self) -> None:
        if self.drawn:
            self.out.write("\r" + " " * self.drawn + "\r")
            self.drawn = 0

    def _emit(self, text: str, *, lasting: bool, end: bool = False) -> None:
        with self.lock:
            if end:
                self._stop_ticking()
            if lasting:
                self._write_line(self._line(text))  # above the bar, which is redrawn under it (not after the cycle)
            else:
                self._redraw()

    def _write_line(self, text: str) -> None:
        with self.lock:
            self._erase()
            super()._write_line(text)
            self._redraw()

    def close(self) -> None:
        with self.lock:
            self._stop_ticking()
            if self.drawn:  # interrupted mid-cycle: end the bar's line, keep what it said
                self.out.write("\n")
                self.out.flush()
                self.drawn = 0
            super().close()


def make_progress(mode: str, out: TextIO | None = None, clock: Callable[[], float] = time.monotonic,
                  tick: float | None = 1.0) -> Progress:
    """The reporter of a resolved mode (:func:`resolve_mode`): lines, bar or none."""
    if mode == "lines":
        return LineProgress(out, clock)
    if mode == "bar":
        return BarProgress(out, clock, tick=tick)
    if mode == "none":
        return Progress(out, clock)
    raise ValueError(f"progress mode {mode!r}: choose lines, bar or none (auto is resolved first)")


_current: Progress | None = None


def start(option: str | None) -> Progress:
    """The command's reporter, its elapsed time counted from now (`run` and `learn` call this first).
    Raises ValueError on an unknown mode."""
    global _current
    if _current is not None:
        _current.close()
    _current = make_progress(resolve_mode(option))
    return _current


def current() -> Progress:
    """The reporter :func:`start` made (a caller that did not start one gets auto's)."""
    return _current if _current is not None else start(None)


class JobEvents:
    """Feeds a reporter from ``jobs.runner.run_cycle``'s callbacks: :meth:`about_to_run` is its
    ``on_start``, :meth:`event` its ``on_event`` (the job's name and one Dagster ``EventLogEntry`` of its
    run, as the instance stores it), :meth:`finished` its ``on_run``. ``steps_of(job)``: the stages of a
    job, for the bar (None when unknown). ``error_of(dagster_event)``: a failed step's own error."""

    def __init__(self, progress: Progress, steps_of: Callable[[str], int | None] = lambda job: None,
                 error_of: Callable[[Any], str] | None = None):
        self.progress = progress
        self.steps_of = steps_of
        self.error_of = error_of
        self.run_id: str | None = None

    def about_to_run(self, what: str) -> None:
        self.progress.job_about_to_run(what)

    def event(self, job: str, entry: Any) -> None:
        event = getattr(entry, "dagster_event", None)
        if event is None:  # a log message, not an event
            return
        if entry.run_id != self.run_id:  # the first event of the job's run
            self.run_id = entry.run_id
            try:
                steps = self.steps_of(job)
            except Exception:  # the bar goes without a total rather than the run failing
                steps = None
            self.progress.job_started(job, steps)
        kind = event.event_type_value
        stage = entry.step_key or getattr(event, "step_key", None)
        if stage is None:
            return
        if kind == "STEP_START":
            self.progress.stage_started(stage)
        elif kind == "STEP_SUCCESS":
            self.progress.stage_finished(stage)
        elif kind == "STEP_SKIPPED":
            self.progress.stage_skipped(stage)
        elif kind == "STEP_FAILURE":
            self.progress.stage_failed(stage, self._error(event))

    def _error(self, event: Any) -> str:
        if self.error_of is None:
            return ""
        try:
            return self.error_of(event)
        except Exception:  # the line names the stage even when its error cannot be read
            return ""

    def finished(self, run: Any) -> None:
        self.progress.job_finished(run.job, run.seconds, run.partition, run.run_id)
