"""The ``swe`` family: bug-fixing episodes on the mini-SWE catalogue in the sandbox (``envs/swe.py``)."""

from tentalis_pipelines.envs import swe_tasks
from tentalis_pipelines.tasks.families import Recipe, TaskFamily


class SweFamily(TaskFamily):
    name = "swe"
    levels = swe_tasks.LEVELS
    default_recipe = Recipe(max_new_tokens=128, max_turns=8)
    environment = swe_tasks.ENVIRONMENT

    def make_env(self, max_turns: int):
        from tentalis_pipelines.envs.swe import SweConfig, SweEnv, swe_terminal_config

        return SweEnv(SweConfig(terminal=swe_terminal_config(max_turns)))

    def task_from_row(self, row):
        return swe_tasks.SweTask.from_task_row(row)


FAMILY = SweFamily()
