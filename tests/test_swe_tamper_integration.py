"""The tests of ``tests/unit/test_swe_tamper.py`` that cost more CPU than the unit tier allows (tests/cpu_budget.py):
the same tests, moved here unchanged; the unit file keeps the rest."""

from __future__ import annotations

from tentalis_pipelines.envs.swe import SuiteRun, suite_verdict
from tentalis_pipelines.envs.swe_tamper import module_findings
from tentalis_pipelines.envs.swe_tasks import held_out_tasks


def test_the_catalogue_modules_and_their_honest_fixes_have_no_finding():
    for task in held_out_tasks():
        from tentalis_pipelines.envs.swe_repos import REPOS

        assert module_findings(task.tree[task.source_file], REPOS[task.module][1], task.source_file) == [], task.task_id


def test_a_forged_pass_scores_zero_even_when_every_test_passed():
    task = next(t for t in held_out_tasks() if t.task_id == "swe-roman-binary_operator-l014c14")
    every = dict.fromkeys(task.fail_to_pass + task.pass_to_pass, "PASSED")
    assert suite_verdict(task, SuiteRun(every))[0].reward == 1.0
    verdict, passed, total = suite_verdict(task, SuiteRun(every, forged={task.fail_to_pass[0]: "a canary passed",
                                                                          task.fail_to_pass[1]: "negated passed"}))
    assert (verdict.passed, verdict.reward, passed, total) == (False, 0.0, 0, 6)
    assert verdict.detail.startswith("forged verdict (2 test(s) cannot fail): ")
