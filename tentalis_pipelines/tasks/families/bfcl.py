"""The ``bfcl`` family: generated tool-calling episodes on BFCL's simulators (``envs/bfcl.py``)."""

from tentalis_pipelines.envs import bfcl_tasks
from tentalis_pipelines.tasks.families import Recipe, TaskFamily


class BfclFamily(TaskFamily):
    name = "bfcl"
    levels = bfcl_tasks.LEVELS
    # max_turns: replies with calls per user turn; 128 tokens per reply; the policy's temperature.
    default_recipe = Recipe(max_new_tokens=128, max_turns=8)
    environment = "bfcl"

    def make_env(self, max_turns: int):
        from tentalis_pipelines.envs.bfcl import BfclConfig, BfclEnv

        # max_turns: the replies with calls allowed per user turn (BFCL's step limit; past it, a force-quit).
        return BfclEnv(BfclConfig(max_steps_per_turn=max_turns))

    def task_from_row(self, row):
        from tentalis_pipelines.envs.bfcl import BfclTask

        return BfclTask.from_task_row(row)


FAMILY = BfclFamily()
