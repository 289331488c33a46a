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
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

# Seconds of CPU one phase (setup, call or teardown) of one unit test may use. Raising it is a decision:
# tests/unit/test_cpu_budget.py pins it, and docs/testing.md says why it is what it is.
CPU_BUDGET_S = 2.0
PLUGIN_NAME = "tests-unit-cpu-budget"


def over_budget(nodeid: str, phase: str, used_s: float, budget_s: float = CPU_BUDGET_S) -> str | None:
    """The failure message for a phase that used ``used_s`` seconds of CPU, or None within the budget."""
    if used_s <= budget_s:
        return None
    return (f"over the CPU budget: {nodeid}: its {phase} used {used_s:.2f} s of CPU, over the unit tier's budget of {budget_s:g} s "
            f"(tests/cpu_budget.py): make it cheaper (smaller data, a module-scoped fixture, fewer cases) "
            f"or move it to tests/ (the integration tests)")


class CpuBudget:
    """A plugin: times each phase of each test under ``root`` with ``clock`` (the thread's CPU seconds) and fails
    a phase over ``budget_s``. A phase that already failed keeps its own error; the budget is checked
    only for phases that passed. The setup of the fixtures named in ``exempt`` (the shared model cache,
    filled once on a fresh clone) is not counted."""

    def __init__(self, root: Path, budget_s: float = CPU_BUDGET_S, clock: Callable[[], float] = time.thread_time,
                 exempt: frozenset[str] = frozenset()):
        self.root, self.budget_s, self.clock, self.exempt = Path(root), budget_s, clock, frozenset(exempt)
        self._exempt_s = 0.0  # CPU spent in exempt fixtures' setup during the current phase

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
        message = over_budget(item.nodeid, phase, self.clock() - start - self._exempt_s, self.budget_s)
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
