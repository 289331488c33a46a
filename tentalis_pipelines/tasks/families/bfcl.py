"""The ``bfcl`` family: generated tool-calling episodes on BFCL's simulators (``envs/bfcl.py``)."""

from tentalis_pipelines.envs import bfcl_tasks
from tentalis_pipelines.tasks.families import Recipe, TaskFamily


class BfclFamily(TaskFamily):
    name = "bfcl"
    levels = bfcl_tasks.LEVELS
    # max_turns: replies with calls per user turn; 128 tokens per reply; the policy's temperature.
    default_recipe = Recipe(max_new_tokens=128, max_turns=8)


FAMILY = BfclFamily()
