"""The unit tier's CPU budget: a test under ``tests/unit`` whose setup, call or teardown uses more than
:data:`CPU_BUDGET_S` seconds of CPU fails, saying so. ``tests/unit/conftest.py`` registers it for that
folder; ``tests/unit/test_cpu_budget.py`` checks that it is on and that it fails what it should.

Why CPU time and not the wall clock: the project measures performance in benchmarks, never in timed unit
tests, because a wall-clock limit fails whenever the machine is busy. The CPU time of the thread that runs
the test (:func:`time.thread_time`) moves far less with the load around it; it is what the test costs, and
a test that needs seconds of it (a whole Delta pipeline, a model, thousands of cases) belongs in
``tests/`` with the integration tests. The test's own thread and not the whole process: ``make test`` runs
this folder in one process after every integration test, and whatever threads those left behind, like
xdist's own messaging thread, must not be billed to a unit test. So work a test hands to another thread
(an in-thread server) is not counted either. The budget is several times the slowest test the tier had
when it was set, so only a real change trips it.

What it does not see: time a test spends waiting (``time.sleep``, a thread it waits on, a subprocess,
which the conftest refuses anyway). Those cost wall time but no CPU; keep them short by hand.

The tier as a whole has a budget too, :data:`TIER_CPU_BUDGET_S`: the CPU its tests' phases use, summed over
every test of the session (the same measure as above, so the exempt cache fixtures are left out), checked
at the end of a session that ran nothing but this folder (``make test-fast``; ``make test``, which runs
every tier, is not checked). Many tests each under the per-test budget can still add up to an inner loop
that is not fast: past the budget the session fails, naming the total and the tests that cost the most.
Under pytest-xdist each worker sums its own tests and the controller adds the sums up, so the total does
not depend on the number of workers. Again CPU time and not the wall clock: on this 2-core machine with
other work on it, the wall clock of ``make test-fast`` varied 2x between runs, the sum of the tests' CPU
far less. What it leaves out, the start-up of each process (importing torch, transformers and Dagster and
the test modules), is reported beside the total but not failed: the first run after a checkout also
compiles the bytecode, which doubles it.
"""

from __future__ import annotations

import resource
import time
from collections.abc import Callable
from pathlib import Path

import pytest

# Seconds of CPU one phase (setup, call or teardown) of one unit test may use. Raising it is a decision:
# tests/unit/test_cpu_budget.py pins it, and docs/testing.md says why it is what it is.
CPU_BUDGET_S = 2.0
# Seconds of CPU all the phases of all the tier's tests may use together, in a session that ran only this
# folder. Also a decision: pinned by tests/unit/test_cpu_budget.py, explained in docs/testing.md.
TIER_CPU_BUDGET_S = 30.0
PLUGIN_NAME = "tests-unit-cpu-budget"
WORKER_OUTPUT_KEY = "tests-unit-cpu"  # what an xdist worker hands the controller: its tests' CPU and start-up
SLOWEST_SHOWN = 10


def process_cpu_s() -> float:
    """The CPU seconds (user and system) this process has used since it started."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def over_budget(nodeid: str, phase: str, used_s: float, budget_s: float = CPU_BUDGET_S) -> str | None:
    """The failure message for a phase that used ``used_s`` seconds of CPU, or None within the budget."""
    if used_s <= budget_s:
        return None
    return (f"over the CPU budget: {nodeid}: its {phase} used {used_s:.2f} s of CPU, over the unit tier's budget of {budget_s:g} s "
            f"(tests/cpu_budget.py): make it cheaper (smaller data, a module-scoped fixture, fewer cases) "
            f"or move it to tests/ (the integration tests)")


def over_tier_budget(spent: dict[str, float], budget_s: float = TIER_CPU_BUDGET_S) -> str | None:
    """The failure message for a tier whose tests (node id -> CPU seconds of its phases) used more than
    ``budget_s`` together, naming the costliest, or None within the budget."""
    total = sum(spent.values())
    if total <= budget_s:
        return None
    slowest = sorted(spent.items(), key=lambda kv: -kv[1])[:SLOWEST_SHOWN]
    return "\n".join([
        f"over the unit tier's CPU budget: its {len(spent)} tests used {total:.1f} s of CPU together, over the budget "
        f"of {budget_s:g} s (TIER_CPU_BUDGET_S, tests/cpu_budget.py): make the costliest cheaper or move them to "
        f"tests/ (the integration tests). The costliest:",
        *(f"  {seconds:.2f} s  {nodeid}" for nodeid, seconds in slowest)])


class CpuBudget:
    """A plugin: times each phase of each test under ``root`` with ``clock`` (the thread's CPU seconds) and fails
    a phase over ``budget_s``. A phase that already failed keeps its own error; the budget is checked
    only for phases that passed. The setup of the fixtures named in ``exempt`` (the shared model cache,
    filled once on a fresh clone) is not counted.

    It also adds up what every test under ``root`` used and, at the end of a session that collected
    nothing else, fails the session when the sum is over ``tier_budget_s`` (see the module's docstring);
    ``process_clock`` gives the process's CPU for the start-up it reports."""

    def __init__(self, root: Path, budget_s: float = CPU_BUDGET_S, clock: Callable[[], float] = time.thread_time,
                 exempt: frozenset[str] = frozenset(), tier_budget_s: float = TIER_CPU_BUDGET_S,
                 process_clock: Callable[[], float] = process_cpu_s):
        self.root, self.budget_s, self.clock, self.exempt = Path(root), budget_s, clock, frozenset(exempt)
        self.tier_budget_s, self.process_clock = tier_budget_s, process_clock
        self._exempt_s = 0.0  # CPU spent in exempt fixtures' setup during the current phase
        self.spent: dict[str, float] = {}  # node id -> CPU of its phases, this process's tests (or all workers')
        self.startup_s: list[float] = []  # each process's CPU once its tests were collected
        self.tier_only: bool | None = None  # whether the session collected only tests under root
        self.message: str | None = None  # the tier's failure, once the session is over it

    @pytest.hookimpl(wrapper=True)
    def pytest_fixture_setup(self, fixturedef, request):
        if fixturedef.argname not in self.exempt:
            return (yield)
        start = self.clock()
        try:
            return (yield)
        finally:
            self._exempt_s += self.clock() - start

    def applies(self, item: pytest.Item) -> bool:
        return self.root in Path(item.path).parents

    def _timed(self, item: pytest.Item, phase: str):
        if not self.applies(item):
            return (yield)
        self._exempt_s, start = 0.0, self.clock()
        result = yield  # a phase that raised is reported as it failed, budget or not
        used = self.clock() - start - self._exempt_s
        self.spent[item.nodeid] = self.spent.get(item.nodeid, 0.0) + used
        message = over_budget(item.nodeid, phase, used, self.budget_s)
        if message:
            pytest.fail(message, pytrace=False)  # the message alone: the traceback would show this plugin
        return result

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_setup(self, item):
        return (yield from self._timed(item, "setup"))

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item):
        return (yield from self._timed(item, "call"))

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_teardown(self, item):
        return (yield from self._timed(item, "teardown"))

    # ---- the tier's total
    def pytest_collection_finish(self, session):
        self.startup_s.append(self.process_clock())
        self.tier_only = bool(session.items) and all(self.applies(item) for item in session.items)

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node, error):
        """On the xdist controller: a worker is done; add its tests' CPU and its start-up to the session's."""
        sent = getattr(node, "workeroutput", {}).get(WORKER_OUTPUT_KEY)
        if sent is None:
            return
        self.spent.update(sent["spent"])
        self.startup_s.append(sent["startup_s"])
        self.tier_only = sent["tier_only"] if self.tier_only is None else self.tier_only and sent["tier_only"]

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session):
        workeroutput = getattr(session.config, "workeroutput", None)
        if workeroutput is not None:  # an xdist worker: the controller checks the total
            workeroutput[WORKER_OUTPUT_KEY] = {"spent": self.spent, "startup_s": max(self.startup_s, default=0.0),
                                               "tier_only": bool(self.tier_only)}
            return
        if not self.tier_only:
            return
        self.message = over_tier_budget(self.spent, self.tier_budget_s)
        if self.message and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter):
        if getattr(terminalreporter.config, "workeroutput", None) is not None or not self.tier_only:
            return
        if self.message:
            terminalreporter.write_sep("=", "over the unit tier's CPU budget", red=True)
            terminalreporter.write_line(self.message)
        startup = f"; start-up up to {max(self.startup_s):.1f} s per process" if self.startup_s else ""
        terminalreporter.write_line(f"unit tier CPU: its tests {sum(self.spent.values()):.1f} s of the {self.tier_budget_s:g} s "
                                    f"budget{startup}")
