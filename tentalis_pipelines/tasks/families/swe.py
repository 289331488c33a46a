"""The ``swe`` family: bug-fixing episodes on the mini-SWE catalogue in the sandbox (``envs/swe.py``)."""

from tentalis_pipelines.envs import swe_tasks
from tentalis_pipelines.tasks.families import Recipe, TaskFamily


class SweFamily(TaskFamily):
    name = "swe"
    levels = swe_tasks.LEVELS
    default_recipe = Recipe(max_new_tokens=128, max_turns=8)


FAMILY = SweFamily()
