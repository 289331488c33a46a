"""The fast unit tests: pure functions over rows, Arrow tables and tensors. `make test-fast` runs this
folder alone (seconds); `make test` runs it with everything else.

What "unit" means here is enforced, not hoped for: a test in this folder that starts a subprocess, builds
a model (even the tiny random one) or runs a Dagster job fails at once, naming what it did. Such a test
belongs in ``tests/`` beside the integration tests.
"""

from __future__ import annotations

import subprocess
import sys

# Imported before any test runs: on its first import, Dagster's vendored croniter asks the `file` program
# about the platform (a subprocess), which the guard below would otherwise blame on whichever test came first.
import dagster._vendored.croniter  # noqa: F401
import pytest


class NotAUnitTest(AssertionError):
    """A test under tests/unit did something slow; move it to tests/."""


def _refuse(what: str):
    def refuse(*args, **kwargs):
        raise NotAUnitTest(f"a unit test may not {what}: move this test to tests/ (the integration tests)")

    return refuse


@pytest.fixture(autouse=True)
def _only_pure_work(monkeypatch):
    monkeypatch.setattr(subprocess.Popen, "__init__", _refuse("start a subprocess"))
    # Only what the test modules already imported can be called: guard those (importing transformers or
    # dagster here just to guard them would cost the seconds this folder exists to save).
    if "transformers" in sys.modules:
        monkeypatch.setattr(sys.modules["transformers"].PreTrainedModel, "__init__", _refuse("build a model"))
    if "dagster" in sys.modules:
        from dagster._core.execution import api

        monkeypatch.setattr(api.ExecuteRunWithPlanIterable, "__init__", _refuse("run a Dagster job"))
    yield
