"""The tests of ``tests/unit/test_swe_tamper.py`` that cost more CPU than the unit tier allows (tests/cpu_budget.py):
the same tests, moved here unchanged; the unit file keeps the rest."""

from __future__ import annotations

from tentalis_pipelines.envs.swe_tamper import module_findings
from tentalis_pipelines.envs.swe_tasks import held_out_tasks


def test_the_catalogue_modules_and_their_honest_fixes_have_no_finding():
    for task in held_out_tasks():
        from tentalis_pipelines.envs.swe_repos import REPOS

        assert module_findings(task.tree[task.source_file], REPOS[task.module][1], task.source_file) == [], task.task_id
