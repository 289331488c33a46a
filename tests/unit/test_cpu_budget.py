"""The unit tier's CPU budget (tests/cpu_budget.py): on for this folder, at the documented size, and it fails
a test that uses more CPU than that, in each phase, without hiding a test's own failure. The runs below are
pytest sessions inside this process (``runpytest_inprocess``): no subprocess."""

from __future__ import annotations

import time
from pathlib import Path

from tests.cpu_budget import CPU_BUDGET_S, PLUGIN_NAME, CpuBudget, over_budget

pytest_plugins = ["pytester"]

HERE = Path(__file__).resolve().parent


def test_the_budget_is_on_for_this_folder_at_its_documented_size(request):
    """Switching the check off (not registering it, ``-p no:tests-unit-cpu-budget``) or raising the budget
    fails here: a change to the budget is a decision made in this file and in docs/testing.md."""
    plugin = request.config.pluginmanager.get_plugin(PLUGIN_NAME)
    assert isinstance(plugin, CpuBudget), f"the CPU budget plugin {PLUGIN_NAME!r} is not registered"
    assert plugin.root == HERE and plugin.applies(request.node)
    assert plugin.budget_s == CPU_BUDGET_S == 2.0
    assert plugin.clock is time.thread_time
    assert plugin.exempt == {"embedded_model_dir", "tiny_model_dir", "repository_parsed"}  # the fixed costs alone
    assert f"{CPU_BUDGET_S:g} s of CPU" in (HERE.parents[1] / "docs" / "testing.md").read_text()


def test_the_message_names_the_test_the_phase_and_what_to_do():
    assert over_budget("t.py::x", "call", 1.0, 1.0) is None
    message = over_budget("t.py::x", "call", 1.5, 1.0)
    assert message.startswith("over the CPU budget: t.py::x: its call used 1.50 s of CPU") and "budget of 1 s" in message
    assert "make it cheaper" in message and "move it to tests/" in message


BURN = """
import time

def burn(seconds):
    start = time.thread_time()
    while time.thread_time() - start < seconds:
        pass
"""


def _run(pytester, source: str, budget_s: float = 0.05, **kwargs):
    pytester.makepyfile(test_budgeted=BURN + source)
    return pytester.runpytest_inprocess("-p", "no:cacheprovider", "-p", "no:xdist",
                                        plugins=[CpuBudget(pytester.path, budget_s, **kwargs)])


def test_a_test_over_the_budget_fails_in_the_phase_that_spent_it(pytester):
    result = _run(pytester, """
import pytest

@pytest.fixture()
def costly_setup():
    burn(0.12)

@pytest.fixture()
def costly_teardown():
    yield
    burn(0.12)

def test_cheap():
    assert sum(range(10)) == 45

def test_costly_call():
    burn(0.12)

def test_costly_fixture(costly_setup):
    pass

def test_costly_teardown(costly_teardown):
    pass
""")
    result.assert_outcomes(passed=2, failed=1, errors=2)  # the teardown's error is reported beside its pass
    for line in ("*over the CPU budget: test_budgeted.py::test_costly_call: its call used 0.1* s of CPU, "
                 "over the unit tier's budget of 0.05 s*",
                 "*over the CPU budget: test_budgeted.py::test_costly_fixture: its setup used 0.1* s of CPU*",
                 "*over the CPU budget: test_budgeted.py::test_costly_teardown: its teardown used 0.1* s of CPU*"):
        result.stdout.fnmatch_lines([line])
    assert not [line for line in result.outlines if "over the CPU budget" in line and "test_cheap" in line]


def test_a_failing_test_keeps_its_own_error_and_other_folders_are_not_budgeted(pytester):
    result = _run(pytester, """
def test_fails_after_burning():
    burn(0.12)
    assert 1 == 2, "its own failure"
""")
    result.assert_outcomes(failed=1)
    assert "its own failure" in result.stdout.str() and "over the CPU budget" not in result.stdout.str()

    pytester.makepyfile(test_elsewhere=BURN + "\ndef test_costly():\n    burn(0.12)\n")
    outside = pytester.runpytest_inprocess("-p", "no:cacheprovider", "-p", "no:xdist", "test_elsewhere.py",
                                           plugins=[CpuBudget(pytester.path / "unit", 0.05)])
    outside.assert_outcomes(passed=1)


def test_the_shared_cache_fixtures_setup_is_not_counted(pytester):
    """Filling the model cache on a fresh clone (a session fixture) is not the test's cost."""
    result = _run(pytester, """
import pytest

@pytest.fixture(scope="session")
def embedded_model_dir():
    burn(0.12)
    return "cache"

def test_uses_the_cache(embedded_model_dir):
    assert embedded_model_dir == "cache"
""", exempt=frozenset({"embedded_model_dir"}))
    result.assert_outcomes(passed=1)
