"""The unit tier's CPU budget (tests/cpu_budget.py): on for this folder, at the documented size, and it fails
a test that uses more CPU than that, in each phase, without hiding a test's own failure; and the tier's
total: a session of this folder alone whose tests add up to more than the tier's budget fails. The runs
below are pytest sessions inside this process (``runpytest_inprocess``): no subprocess."""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.cpu_budget import (
    CPU_BUDGET_S,
    PLUGIN_NAME,
    TIER_CPU_BUDGET_S,
    WORKER_OUTPUT_KEY,
    CpuBudget,
    over_budget,
    over_tier_budget,
    process_cpu_s,
)

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
    assert plugin.exempt == {"embedded_model_dir", "tiny_model_dir", "repository_parsed", "smol_tokenizer"}  # the fixed costs alone
    assert f"{CPU_BUDGET_S:g} s of CPU" in (HERE.parents[1] / "docs" / "testing.md").read_text()


def test_the_tiers_budget_is_on_at_its_documented_size(request):
    """The same for the tier's total: raising it is a decision made here and in docs/testing.md."""
    plugin = request.config.pluginmanager.get_plugin(PLUGIN_NAME)
    assert plugin.tier_budget_s == TIER_CPU_BUDGET_S == 30.0
    assert plugin.process_clock is process_cpu_s
    assert f"{TIER_CPU_BUDGET_S:g} s of CPU for the whole tier" in (HERE.parents[1] / "docs" / "testing.md").read_text()


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


def test_the_tier_fails_when_its_tests_add_up_past_its_budget_each_within_its_own(pytester):
    source = "\n".join(f"def test_{i}():\n    burn(0.06)\n" for i in range(3))
    over = _run(pytester, source, budget_s=1.0, tier_budget_s=0.15)
    over.assert_outcomes(passed=3)  # every test passes; the session does not
    assert over.ret == pytest.ExitCode.TESTS_FAILED
    over.stdout.fnmatch_lines(["*over the unit tier's CPU budget: its 3 tests used 0.* s of CPU together, over the budget of 0.15 s*",
                               "  0.0* s  test_budgeted.py::test_*"])
    within = _run(pytester, source, budget_s=1.0, tier_budget_s=1.0)
    assert within.ret == pytest.ExitCode.OK and "over the unit tier" not in within.stdout.str()
    within.stdout.fnmatch_lines(["unit tier CPU: its tests 0.* s of the 1 s budget; start-up up to * s per process"])


def test_a_session_with_tests_from_other_folders_is_not_held_to_the_tiers_budget(pytester):
    """make test runs this folder with every other tier: its total is not the inner loop's."""
    pytester.makepyfile(test_elsewhere=BURN + "\ndef test_costly():\n    burn(0.06)\n")
    pytester.mkdir("unit")
    (pytester.path / "unit" / "test_inside.py").write_text(BURN + "\ndef test_costly():\n    burn(0.06)\n")
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "-p", "no:xdist",
                                          plugins=[CpuBudget(pytester.path / "unit", 1.0, tier_budget_s=0.01)])
    result.assert_outcomes(passed=2)
    assert result.ret == pytest.ExitCode.OK and "unit tier" not in result.stdout.str()


def test_under_xdist_the_controller_adds_up_what_each_worker_spent():
    """Each worker hands its tests' CPU to the controller (workeroutput); the controller checks the sum, so the
    total is the same with one worker or many. A worker never fails the session itself."""
    worker = CpuBudget(HERE, tier_budget_s=1.0)
    worker.spent, worker.startup_s, worker.tier_only = {"a.py::t": 0.75}, [3.5], True
    session = SimpleNamespace(config=SimpleNamespace(workeroutput={}), exitstatus=pytest.ExitCode.OK)
    worker.pytest_sessionfinish(session)
    assert session.exitstatus == pytest.ExitCode.OK
    assert session.config.workeroutput[WORKER_OUTPUT_KEY] == {"spent": {"a.py::t": 0.75}, "startup_s": 3.5, "tier_only": True}

    controller = CpuBudget(HERE, tier_budget_s=1.0)
    controller.pytest_testnodedown(SimpleNamespace(workeroutput=session.config.workeroutput), None)
    controller.pytest_testnodedown(SimpleNamespace(workeroutput={WORKER_OUTPUT_KEY: {
        "spent": {"b.py::t": 0.5}, "startup_s": 4.0, "tier_only": True}}), None)
    controller.pytest_testnodedown(SimpleNamespace(workeroutput={}), "a worker that died sends nothing")
    finished = SimpleNamespace(config=SimpleNamespace(), exitstatus=pytest.ExitCode.OK)
    controller.pytest_sessionfinish(finished)
    assert finished.exitstatus == pytest.ExitCode.TESTS_FAILED and controller.startup_s == [3.5, 4.0]
    assert controller.message == over_tier_budget({"a.py::t": 0.75, "b.py::t": 0.5}, 1.0)
    assert controller.message.startswith("over the unit tier's CPU budget: its 2 tests used 1.2 s of CPU together")
    assert controller.message.splitlines()[1:] == ["  0.75 s  a.py::t", "  0.50 s  b.py::t"]


def test_the_tiers_message_names_the_total_the_budget_and_the_costliest_tests():
    assert over_tier_budget({"t.py::x": 1.0}, 1.0) is None
    spent = {f"t.py::test_{i:02d}": i / 10 for i in range(15)}
    message = over_tier_budget(spent, 1.0)
    assert message.startswith("over the unit tier's CPU budget: its 15 tests used 10.5 s of CPU together, over the budget of 1 s")
    assert "move them to tests/" in message
    assert message.splitlines()[1:] == [f"  {i / 10:.2f} s  t.py::test_{i:02d}" for i in range(14, 4, -1)]  # the ten costliest
