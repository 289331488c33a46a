"""The fast unit tests: pure functions over rows, Arrow tables and tensors. `make test-fast` runs this
folder alone (seconds); `make test` runs it with everything else.

What "unit" means here is enforced, not hoped for: a test in this folder that starts a subprocess, builds
a model (even the tiny random one) or runs a Dagster job fails at once, naming what it did. Such a test
belongs in ``tests/`` beside the integration tests.

So is "fast": each phase (setup, call, teardown) of a test here may use at most
``tests.cpu_budget.CPU_BUDGET_S`` seconds of CPU, or it fails, "over the CPU budget". CPU time, not the wall
clock: the CPU time of the test's thread is what the test costs the tier, and it moves far less than the
wall clock when the machine is busy, so the check
does not flake the way a timed test would (the project times things in benchmarks, never in unit tests).
The budget is generous (several times the slowest test here when it was set); a test that needs more
is an integration test. So is the whole folder's: a session of this folder alone whose tests use more than
``tests.cpu_budget.TIER_CPU_BUDGET_S`` seconds of CPU together fails, "over the unit tier's CPU budget".
``test_cpu_budget.py`` fails if either budget is switched off or raised.
"""

from __future__ import annotations

import gc
import subprocess
import sys
from pathlib import Path

# Imported before any test runs: on its first import, Dagster's vendored croniter asks the `file` program
# about the platform (a subprocess), which the guard below would otherwise blame on whichever test came first.
import dagster._vendored.croniter  # noqa: F401

# The same for matplotlib: on a machine without its font cache (a fresh CI runner) the first import of its
# font manager runs `fc-list` to build the cache; done here, once, before any test is guarded.
import matplotlib.font_manager  # noqa: F401
import pytest

from tests.cpu_budget import PLUGIN_NAME, CpuBudget

HERE = Path(__file__).resolve().parent

# The garbage collector is off while the test modules are imported (collection), and on again, with what
# they loaded frozen, once they are (pytest_collection_finish below). Importing torch, transformers and
# Dagster creates over a million objects that live until the process ends; each full collection on the
# way walked all of them again (about 1 s of the 4-5 s of CPU a worker spends collecting, here).
gc.disable()


class NotAUnitTest(AssertionError):
    """A test under tests/unit did something slow; move it to tests/."""


def _refuse(what: str):
    def refuse(*args, **kwargs):
        raise NotAUnitTest(f"a unit test may not {what}: move this test to tests/ (the integration tests)")

    return refuse


def _guards():
    guards = [(subprocess.Popen, "__init__", _refuse("start a subprocess"))]
    # Only what the test modules already imported can be called: guard those (importing transformers
    # here just to guard it would cost the seconds this folder exists to save).
    if "transformers" in sys.modules:
        guards.append((sys.modules["transformers"].PreTrainedModel, "__init__", _refuse("build a model")))
    from dagster._core.execution import api

    guards.append((api.ExecuteRunWithPlanIterable, "__init__", _refuse("run a Dagster job")))
    return guards


# The shared cache's session fixtures (tests/conftest.py): on a fresh clone the first test that asks for one
# converts the embedded GGUF (a model is built) once for the whole run; that is the cache being filled, not
# the test's cost, so their setup runs unguarded. Any other fixture stays guarded, whatever its scope.
CACHE_FIXTURES = frozenset({"embedded_model_dir", "tiny_model_dir"})
BUDGET_EXEMPT = CACHE_FIXTURES | {"repository_parsed", "smol_tokenizer"}
_guarded: list[tuple[object, str, object]] = []  # (owner, name, original) while a test here runs


class _CacheFixturesUnguarded:
    """A plugin, not a conftest hook: pytest asks a session fixture's hooks of the session's conftests (the
    root's), never of this folder's, so a hook here would not be called for them."""

    @pytest.hookimpl(hookwrapper=True)
    def pytest_fixture_setup(self, fixturedef, request):
        if fixturedef.argname not in CACHE_FIXTURES or not _guarded:
            yield
            return
        replaced = [(owner, name, owner.__dict__[name]) for owner, name, _ in _guarded]
        for owner, name, original in _guarded:
            setattr(owner, name, original)
        try:
            yield
        finally:
            for owner, name, replacement in replaced:
                setattr(owner, name, replacement)


def pytest_collection_finish(session):
    """Everything alive once the tests are collected (torch, transformers, Dagster, the test modules and their
    items: over a million objects) lives until the process ends, yet each full run of the garbage collector
    walked it all again, 1-2 s of CPU per worker. Frozen, the collector walks only what the tests create."""
    gc.freeze()
    gc.enable()


def pytest_configure(config):
    config.pluginmanager.register(_CacheFixturesUnguarded(), "tests-unit-cache-fixtures")
    # Fixed costs of the tier, not a test's: filling the shared cache (above, once per clone), parsing the
    # repository for the house rules (test_house.py, once per run) and reading SmolLM2's tokenizer (a session
    # fixture, once per process: 2.5-3 s of CPU here when nothing had imported transformers' tokenizers yet,
    # so `pytest tests/unit/test_sessions.py` alone failed its first test). Every other fixture's setup counts.
    config.pluginmanager.register(CpuBudget(HERE, exempt=BUDGET_EXEMPT), PLUGIN_NAME)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Guard the whole protocol of each test here, its fixtures' setup and teardown included (a
    module-scoped fixture that trains a model is as slow as a test that does). Pytest calls this hook
    for every test of the session, so it guards only the tests under this folder."""
    if HERE not in Path(item.path).parents:
        yield
        return
    for owner, name, replacement in _guards():
        _guarded.append((owner, name, owner.__dict__[name]))
        setattr(owner, name, replacement)
    try:
        yield
    finally:
        for owner, name, original in reversed(_guarded):
            setattr(owner, name, original)
        _guarded.clear()
