"""The mini-SWE family without the sandbox: each mutation kind on a tiny function, the engine's determinism,
the catalogue's FAIL_TO_PASS / PASS_TO_PASS shape and split, task rows, the verdict from a test report
(the episodes in the real sandbox are in tests/test_envs_swe_integration.py)."""

from __future__ import annotations

import ast
import json
from collections import Counter

import pytest

from tentalis_pipelines.env_batches import make_env
from tentalis_pipelines.envs.swe import SuiteRun, parse_report, suite_verdict
from tentalis_pipelines.envs.swe_repos import REPOS, repo_tree
from tentalis_pipelines.envs.swe_tasks import (
    LEVELS,
    TEST_PER_LEVEL,
    SweTask,
    apply_edits,
    find_mutations,
    held_out_tasks,
    load_catalogue,
    training_tasks,
)
from tentalis_pipelines.envs.verdicts import failure_type


def mutants(source: str, kind: str) -> list[str]:
    return [apply_edits(source, m.edits) for m in find_mutations(source) if m.kind == kind]


# --------------------------------------------------------------------------- each kind, by hand
def test_binary_operator_swaps_the_operator_only():
    src = "def f(a, b):\n    return (a + b) * 2\n"
    assert mutants(src, "binary_operator") == ["def f(a, b):\n    return (a - b) * 2\n",
                                               "def f(a, b):\n    return (a + b) // 2\n"]
    assert mutants("def g(x):\n    x -= 1\n    return x\n", "binary_operator") == ["def g(x):\n    x += 1\n    return x\n"]


def test_comparison_swaps_each_operator_of_a_chain():
    src = "def f(a, b, c):\n    return a < b == c\n"
    assert mutants(src, "comparison") == ["def f(a, b, c):\n    return a <= b == c\n",
                                          "def f(a, b, c):\n    return a < b != c\n"]
    assert mutants("def g(x, s):\n    return x not in s\n", "comparison") == ["def g(x, s):\n    return x in s\n"]
    assert mutants("def h(x):\n    return x is None\n", "comparison") == ["def h(x):\n    return x is not None\n"]


def test_boolean_operator_only_with_two_operands():
    assert mutants("def f(a, b):\n    return a and b\n", "boolean_operator") == ["def f(a, b):\n    return a or b\n"]
    assert mutants("def f(a, b, c):\n    return a and b and c\n", "boolean_operator") == []


def test_off_by_one_adds_one_to_integers_not_booleans_or_module_tables():
    src = "TABLE = [1, 2]\n\n\ndef f(x):\n    return x[0] + 10 if True else None\n"
    assert mutants(src, "off_by_one") == ["TABLE = [1, 2]\n\n\ndef f(x):\n    return x[1] + 10 if True else None\n",
                                          "TABLE = [1, 2]\n\n\ndef f(x):\n    return x[0] + 11 if True else None\n"]


def test_negated_condition_wraps_the_test():
    src = "def f(x):\n    if x > 0:\n        return 1\n    return 2\n"
    assert mutants(src, "negated_condition") == ["def f(x):\n    if not (x > 0):\n        return 1\n    return 2\n"]


def test_removed_return_only_inside_a_block():
    src = "def f(x):\n    if x:\n        return 1\n    return 2\n"
    assert mutants(src, "removed_return") == ["def f(x):\n    if x:\n        pass\n    return 2\n"]


def test_swapped_arguments_swaps_the_first_two_distinct_ones():
    assert mutants("def f(a, b):\n    return max(a, b - 1)\n", "swapped_arguments") == ["def f(a, b):\n    return max(b - 1, a)\n"]
    assert mutants("def f(a):\n    return max(a, a)\n", "swapped_arguments") == []


def test_an_edit_that_would_not_reproduce_the_ast_mutation_is_dropped():
    # A comment between the operands: the text between them is not just the operator.
    src = "def f(a, b):\n    return (a  # left\n            + b)\n"
    assert mutants(src, "binary_operator") == []


def test_the_engine_refuses_non_ascii_sources():
    with pytest.raises(ValueError, match="ASCII"):
        find_mutations("def f():\n    return 'caf\u00e9' + 1\n")


def test_the_repositories_are_ascii_and_their_tests_are_plain_functions():
    for module, (level, source, tests) in REPOS.items():
        assert level in LEVELS and source.isascii() and tests.isascii()
        names = [n.name for n in ast.parse(tests).body if isinstance(n, ast.FunctionDef)]
        assert names and all(n.startswith("test_") for n in names)
        assert "import pytest" not in tests
        assert set(repo_tree(module)) == {f"{module}.py", f"test_{module}.py", "run_tests.py"}
    with pytest.raises(ValueError, match="no mini-SWE repository 'nope'"):
        repo_tree("nope")


# --------------------------------------------------------------------------- the catalogue
@pytest.fixture(scope="module")
def catalogue() -> list[SweTask]:
    return load_catalogue()


def test_at_least_100_bugs_each_breaking_a_test_with_swe_bench_lists(catalogue):
    assert len(catalogue) >= 100
    assert len({t.task_id for t in catalogue}) == len(catalogue)
    for t in catalogue:
        tests = REPOS[t.module][2]
        all_ids = {f"test_{t.module}.py::{n.name}" for n in ast.parse(tests).body if isinstance(n, ast.FunctionDef)}
        assert t.fail_to_pass, t.task_id
        assert not set(t.fail_to_pass) & set(t.pass_to_pass)
        assert set(t.fail_to_pass) | set(t.pass_to_pass) == all_ids
        assert t.tree[f"test_{t.module}.py"] == tests  # the tests are pristine; only the module is buggy
        assert t.tree[t.source_file] != REPOS[t.module][1]
        assert t.patch.startswith(f"--- a/{t.module}.py")
    assert set(Counter(t.mutation for t in catalogue)) == {"binary_operator", "comparison", "boolean_operator", "off_by_one",
                                                          "negated_condition", "removed_return", "swapped_arguments"}


def test_the_held_out_split_is_ten_per_level_and_never_trained_on(catalogue):
    held = held_out_tasks()
    assert Counter(t.level for t in held) == dict.fromkeys(LEVELS, TEST_PER_LEVEL)
    assert all(t.split == "test" for t in held)
    held_ids = {t.task_id for t in held}
    train = training_tasks(1, 300)
    assert not held_ids & {t.task_id for t in train}
    assert Counter(t.level for t in train) == dict.fromkeys(LEVELS, 100)
    assert training_tasks(1, 7) == training_tasks(1, 7) and training_tasks(1, 7) != training_tasks(2, 7)
    assert [t.level for t in training_tasks(3, 4, (2, 3))] == [2, 3, 2, 3]
    with pytest.raises(ValueError, match="subset of"):
        training_tasks(1, 4, (0,))


def test_a_catalogue_entry_that_drifted_from_the_sources_is_refused():
    from importlib import resources

    data = json.loads(resources.files("tentalis_pipelines.envs").joinpath("swe_catalogue.json").read_text())
    entry = dict(data["bugs"][0], buggy_sha256="0" * 64)
    with pytest.raises(ValueError, match="rebuild the catalogue"):
        load_catalogue(json.dumps({"bugs": [entry]}))
    with pytest.raises(ValueError, match="unknown repository"):
        load_catalogue(json.dumps({"bugs": [dict(entry, module="nope")]}))


def test_task_rows_round_trip(catalogue):
    t = catalogue[0]
    row = t.task_row()
    assert row["environment"] == "swe"
    assert json.loads(row["reference"]) == {"FAIL_TO_PASS": t.fail_to_pass, "PASS_TO_PASS": t.pass_to_pass}
    assert SweTask.from_task_row(row) == t
    assert SweTask.from_dict(t.to_dict()) == t


# --------------------------------------------------------------------------- the verdict from a report
def _task() -> SweTask:
    return SweTask(task_id="t", level=1, module="m", mutation="comparison", instruction="fix", tree={},
                   fail_to_pass=["test_m.py::test_a"], pass_to_pass=["test_m.py::test_b", "test_m.py::test_c"], solution=[])


def test_the_report_is_read_after_the_marker_only():
    out = "test_m.py::test_a PASSED\n@@M@@{\"test_m.py::test_a\": \"PASSED\"}\n"
    assert parse_report(out, "@@M@@").results == {"test_m.py::test_a": "PASSED"}
    assert parse_report("no marker here", "@@M@@").results is None
    assert "not JSON" in parse_report("@@M@@{oops", "@@M@@").error
    assert "malformed" in parse_report('@@M@@{"a": "MAYBE"}', "@@M@@").error
    assert "timed out" in parse_report("", "@@M@@", exit_code=None, timed_out=True).error


def test_reward_is_one_only_when_fail_to_pass_and_pass_to_pass_all_pass():
    task = _task()
    ok = {"test_m.py::test_a": "PASSED", "test_m.py::test_b": "PASSED", "test_m.py::test_c": "PASSED"}
    verdict, passed, total = suite_verdict(task, SuiteRun(ok))
    assert (verdict.passed, verdict.reward, passed, total) == (True, 1.0, 3, 3)
    broke = {**ok, "test_m.py::test_c": "FAILED"}  # fixed the bug, broke another test
    verdict, passed, total = suite_verdict(task, SuiteRun(broke))
    assert (verdict.passed, verdict.reward, passed, total) == (False, 0.0, 2, 3)
    assert "PASS_TO_PASS 1/2" in verdict.detail and "test_c" in verdict.detail
    missing = {"test_m.py::test_b": "PASSED", "test_m.py::test_c": "PASSED"}  # a required test not in the report
    assert suite_verdict(task, SuiteRun(missing))[0].detail.startswith("FAIL_TO_PASS 0/1")
    assert suite_verdict(task, SuiteRun(None, "the test run timed out"))[0].detail == "tests not run: the test run timed out"
    # a PASS_TO_PASS test missing from the report (deleted or renamed by the agent) counts as failed
    no_c = {"test_m.py::test_a": "PASSED", "test_m.py::test_b": "PASSED"}
    verdict, passed, total = suite_verdict(task, SuiteRun(no_c))
    assert (verdict.passed, verdict.reward, passed, total) == (False, 0.0, 2, 3) and "PASS_TO_PASS 1/2" in verdict.detail
    # no report at all (the module does not import, the run timed out): failed, nothing passed
    verdict, passed, total = suite_verdict(task, SuiteRun(None, "no report"))
    assert (verdict.passed, verdict.reward, passed, total) == (False, 0.0, 0, 3)


def test_a_failed_swe_episode_gets_the_tests_hint():
    assert failure_type(passed=False, end_reason="submitted", check_kind="tests", format_errors=0, turns=3) == "tests_fail"
    assert failure_type(passed=False, end_reason="submitted", check_kind="answer", format_errors=0, turns=3) == "wrong_answer"
    env = make_env("swe", 5)
    assert env.name == "swe" and env.max_turns == 5
    with pytest.raises(ValueError, match="no environment 'bfcl2'"):
        make_env("bfcl2", 5)


# --------------------------------------------------------------------------- batches and the benchmark
def test_a_swe_batch_is_registered_once_and_loads_training_rows(tmp_path):
    from datetime import datetime, timezone

    from tentalis_pipelines.tasks import batches

    bid = batches.register_swe_batch(tmp_path, seed=2, num_tasks=6, levels=(1, 3), max_turns=5)
    assert bid == "swe-s2-n6-l13"
    assert json.loads((tmp_path / bid / "manifest.json").read_text()) == {
        "kind": "swe", "family": "swe", "source": "swe", "seed": 2, "num_tasks": 6, "levels": [1, 3],
        "recipe": {"temperature": None, "max_new_tokens": 128, "max_turns": 5, "num_generations": None}}
    assert batches.register_swe_batch(tmp_path, seed=2, num_tasks=6, levels=(1, 3), max_turns=5) == bid  # idempotent
    with pytest.raises(ValueError, match="other parameters"):
        batches.register_swe_batch(tmp_path, seed=2, num_tasks=6, levels=(1, 3), max_turns=2, batch_id=bid)
    with pytest.raises(ValueError, match="subset of"):
        batches.register_swe_batch(tmp_path, seed=1, num_tasks=5, levels=(0,))
    assert batches.next_swe_seed(tmp_path) == 3
    rows = batches.load_batch(tmp_path, bid, datetime.now(timezone.utc)).tasks
    assert [r["difficulty"] for r in rows] == [1, 3, 1, 3, 1, 3]
    held = {t.task_id for t in held_out_tasks()}
    for r in rows:
        assert (r["batch_id"], r["source"], r["environment"]) == (bid, "generator:swe", "swe")
        assert json.loads(r["metadata"])["max_turns"] == 5 and r["task_id"] not in held
        assert SweTask.from_task_row(r).split == "train"
    assert batches.interrupted_cycle_batch(tmp_path, task_source="swe", num_tasks=6, levels=(1, 3), settled=set()) == bid
    assert batches.interrupted_cycle_batch(tmp_path, task_source="swe", num_tasks=6, levels=(1, 3), settled={bid}) is None


def test_the_swe_benchmark_is_the_held_out_split_with_per_level_success():
    from tentalis_pipelines.evaluation.benchmarks import ItemResult, level_success, load_benchmark, summarize

    name, items = load_benchmark("swe")
    assert name == "swe" and len(items) == 30
    assert {it.item_id for it in items} == {t.task_id for t in held_out_tasks()}
    assert Counter(it.extra["level"] for it in items) == dict.fromkeys(LEVELS, 10)
    assert len(load_benchmark("swe", limit=7)[1]) == 7
    results = [ItemResult(it, "", None, it.extra["level"] == 1 and i % 2 == 0, False, True) for i, it in enumerate(items)]
    per_level = level_success(results)
    assert per_level["1"]["success"] == 0.5 and per_level["2"] == {"n": 10, "success": 0.0, "ci_low": 0.0, "ci_high": 0.2775}
    s = summarize("swe", results, 1.0)
    assert s.accuracy == 5 / 30 and s.ci_low > 0  # Wilson's interval, as for the terminal benchmark


def test_a_text_edit_that_disagrees_with_its_ast_mutation_is_dropped(monkeypatch):
    from tentalis_pipelines.envs import swe_tasks

    def liar(node, text):  # edits the text, leaves the AST alone: the two cannot agree
        if isinstance(node, ast.BinOp):
            a, b = text.end(node.left), text.start(node.right)
            yield "binary_operator", [(a, b, " - ")], lambda n: None

    monkeypatch.setattr(swe_tasks, "FINDERS", (liar,))
    assert find_mutations("def lying_f(a, b):\n    return a + b\n") == []


def test_the_committed_splits_are_the_ones_the_builder_assigns():
    from importlib import resources

    from tentalis_pipelines.envs.swe_tasks import assign_splits

    entries = json.loads(resources.files("tentalis_pipelines.envs").joinpath("swe_catalogue.json").read_text())["bugs"]
    rebuilt = assign_splits([{k: v for k, v in e.items() if k != "split"} for e in entries])
    assert [e["split"] for e in rebuilt] == [e["split"] for e in entries]


def test_a_swe_batch_is_of_the_environment_kind_and_its_rows_load_as_swe_tasks(tmp_path):
    from datetime import datetime, timezone

    from tentalis_pipelines import env_batches
    from tentalis_pipelines.lakehouse import Lakehouse
    from tentalis_pipelines.stages import kinds
    from tentalis_pipelines.tasks import batches

    lake = Lakehouse(tmp_path / "lake")
    bid = batches.register_swe_batch(tmp_path / "batches", seed=1, num_tasks=3, levels=(2,), max_turns=4)
    lake.write_batch("tasks", bid, batches.load_batch(tmp_path / "batches", bid, datetime.now(timezone.utc)).tasks)
    assert kinds.batch_kind(lake, bid) is kinds.ENVIRONMENT
    loaded = env_batches.load_tasks(lake, bid)
    assert [type(t) for _, t in loaded] == [SweTask] * 3
    assert {t.task_id for _, t in loaded} == {t.task_id for t in training_tasks(1, 3, (2,))}
    assert all(t.level == 2 and t.kind == "tests" for _, t in loaded)
