"""The fast unit tests: pure functions over rows, Arrow tables and tensors. `make test-fast` runs this
folder alone (seconds); `make test` runs it with everything else.

What "unit" means here is enforced, not hoped for: a test in this folder that starts a subprocess, builds
a model (even the tiny random one) or runs a Dagster job fails at once, naming what it did. Such a test
belongs in ``tests/`` beside the integration tests.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

# Imported before any test runs: on its first import, Dagster's vendored croniter asks the `file` program
# about the platform (a subprocess), which the guard below would otherwise blame on whichever test came first.
import dagster._vendored.croniter  # noqa: F401
import pytest

HERE = Path(__file__).resolve().parent


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


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Guard the whole protocol of each test here, its fixtures' setup and teardown included (a
    module-scoped fixture that trains a model is as slow as a test that does). Pytest calls this hook
    for every test of the session, so it guards only the tests under this folder."""
    if HERE not in Path(item.path).parents:
        yield
        return
    saved = []
    for owner, name, replacement in _guards():
        saved.append((owner, name, owner.__dict__[name]))
        setattr(owner, name, replacement)
    try:
        yield
    finally:
        for owner, name, original in reversed(saved):
            setattr(owner, name, original)
